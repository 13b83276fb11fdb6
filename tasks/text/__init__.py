"""The one step splitter and the one answer extractor (stdlib only)."""
