"""The pipeline: every stage in order as one run (its stages, parameters and descriptor: stage.py; which stages run
and what each is given, from the registry's declarations: plan.py; what it reports: report.py)."""
