"""One file per settings section; the root and the loader are in config/settings.py."""
