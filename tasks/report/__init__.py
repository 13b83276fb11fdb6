"""Run plots: matplotlib figures (headless, Agg) drawn from a stage's summary data, returned as PNG bytes.

- plots:    one function per plot (survival by operation and round, eliminations by rule, cost and tokens per
            stage, difficulty of synthesized tasks, reward score histograms) and one per stage gathering them.
- markdown: the Prefect markdown artifact that shows a stage's plots (PNG embedded as data: URIs).
Writing the files is storage's (storage/plots.py); the flows attach both (flows/_report.py).
- card: what a dataset card says, assembled from a stage's summary and settings: title, description, body sections
        (lineage and generation settings, models used, cost) and the same facts for the card's YAML header.
"""
