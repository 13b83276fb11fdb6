"""The pipeline: every stage in order as one run (its parameters and descriptor: stage.py)."""
