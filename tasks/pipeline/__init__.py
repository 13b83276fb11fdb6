"""The pipeline: every stage in order as one run (its parameters and descriptor: stage.py; what it reports:
report.py)."""
