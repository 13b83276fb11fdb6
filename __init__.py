"""evolforge: forge RL training data for language models (Evol-Instruct, verified tasks, reward data) with Prefect 3."""

__version__ = "0.1.0"
