"""The nightly chain's folders: where each downstream stage of a night writes when the deployments chain it.

    DATASET/nights/NIGHT/              the night's evolve run (storage/nights.py)
    DATASET/chain/NIGHT/reward-data/   the reward data, then the reward models (train-reward writes into its data
                                       folder, its default)
    DATASET/chain/NIGHT/sft/           the SFT policy (model/), its rows selected by the night's IRM
                                       (reward-data/models/irm) when reward.select_by_irm is on
    DATASET/chain/NIGHT/ppo/           the PPO stage (local/policy/ is the policy it leaves)
    DATASET/chain/NIGHT/eval/          the evaluation of the PPO policy

A chained stage's parameters are written at deploy time and filled by the Prefect server when the upstream run
completes (a deployment trigger, deployments/prefect.yaml), so the layout is also given here as Jinja: the
server renders these expressions over the upstream flow run (`flow_run.parameters.params`, `flow_run.name`).
Prefect's templates cannot call this module, so the expressions only cut and join path strings ('/' separated:
the worker's paths are POSIX), and each folder is found from the upstream run's own folder: the chain root is
the parent of a chained stage's folder; the dataset is two levels above the chain root. `folder_from(upstream,
stage, path)` is any stage's folder of the night from a completed run of another: what each stage's feeds
(tasks/core/stages.py Feed) become in its trigger (deployments/deploy.py).
"""

from __future__ import annotations

from pathlib import Path

CHAIN_DIR = "chain"
NIGHTS_DIR = "nights"  # storage/nights.py NightlyFolder.nights_dir
NIGHT_RUN_PREFIX = "night-"  # the nightly flow run's name: night-YYYY-MM-DD (flows/nightly.py)
# the nightly run evolves one night: the chain's evolve run is the night's folder (storage/nights.py)
NIGHTLY, EVOLVE = "nightly", "evolve"
# stages that write into another stage's folder in the chain: train-reward trains into its data folder (its --out,
# else --data: the folder of a run of it is `out or data`)
SHARED_FOLDERS = {"train-reward": "reward-data"}
# PPOLayout's policy folder relative to its root (storage/ppo.py; tests/deployments/test_chain_triggers.py checks
# they agree), written out: storage/ppo.py loads pyarrow, and the stages' descriptors (the CLI's --help) use this
PPO_POLICY = "local/policy"


def chain_root(dataset: str | Path, night: str) -> Path:
    return Path(dataset) / CHAIN_DIR / night


def stage_dir(dataset: str | Path, night: str, stage: str) -> Path:
    """A chained stage's folder for a night (the chained deployments' triggers render exactly this)."""
    return chain_root(dataset, night) / stage


def night_run_name(night: str) -> str:
    return NIGHT_RUN_PREFIX + night


# --- the same layout as Jinja expressions over the upstream flow run (the text inside {{ }}) --------------------

UP = "flow_run.parameters.params"  # the upstream run's parameters (every stage's flow takes one `params` model)


def _parent(expr: str) -> str:
    return f"({expr}).rstrip('/').rsplit('/', 1)[0]"


def _last(expr: str) -> str:
    return f"({expr}).rstrip('/').rsplit('/', 1)[-1]"


def night_from_run() -> str:
    """The night of a nightly run, from its name."""
    return f"flow_run.name[{len(NIGHT_RUN_PREFIX)}:]"


def night_folder_from_nightly() -> str:
    return f"{UP}.dataset ~ '/{NIGHTS_DIR}/' ~ {night_from_run()}"


def stage_dir_from_nightly(stage: str) -> str:
    return f"{UP}.dataset ~ '/{CHAIN_DIR}/' ~ {night_from_run()} ~ '/{stage}'"


def sibling(folder_expr: str, stage: str) -> str:
    """Another chained stage's folder of the same night, from one chained stage's folder."""
    return f"{_parent(folder_expr)} ~ '/{stage}'"


def night_folder_from(folder_expr: str) -> str:
    """The night's evolve folder, from a chained stage's folder (DATASET/chain/NIGHT/STAGE)."""
    root = _parent(folder_expr)
    return f"{_parent(_parent(root))} ~ '/{NIGHTS_DIR}/' ~ {_last(root)}"


def ran_before(links: list[str]) -> set[str]:
    """The stages whose folders the chain has made by the time a link fires, from the stages of the links before it
    (the nightly run's: the night's evolve run)."""
    return set(links) | ({EVOLVE} if NIGHTLY in links else set())


def run_folder(stage: str) -> str:
    """A completed run's own folder, from its parameters."""
    return f"{UP}.out or {UP}.data" if stage in SHARED_FOLDERS else f"{UP}.out"


def folder_from(upstream: str, stage: str, path: str = "") -> str:
    """The night's folder of `stage` (or `path` inside it), from a completed run of `upstream`."""
    name = SHARED_FOLDERS.get(stage, stage)
    if upstream == NIGHTLY:
        folder = night_folder_from_nightly() if stage == EVOLVE else stage_dir_from_nightly(name)
    else:
        own = run_folder(upstream)
        folder = (night_folder_from(own) if stage == EVOLVE else own if name == SHARED_FOLDERS.get(upstream, upstream)
                  else sibling(own, name))
    return f"({folder}).rstrip('/') ~ '/{path}'" if path else folder


def template(expr: str) -> str:
    """The parameter value: one expression, in parentheses, because the Prefect server turns a one-expression
    value into `{{ expr | tojson }}` to keep its type, and `|` binds tighter than `~`."""
    return "{{ (" + expr + ") }}"
