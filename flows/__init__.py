"""One Prefect flow per stage, reading top to bottom like the DAG.

- evolve: seeds -> Evol-Instruct rounds (upward, downward, in-breadth; elimination) -> datasets + cost ledger.
"""
