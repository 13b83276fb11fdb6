"""What a pipeline run reports, from the summaries of the stages that ran (stage name -> its summary, in the
order they ran) and their folders' ledgers. Plain functions; flows/pipeline.py writes them.

    done(ran)                      what the flow returns: per stage (its name with "_"), the figures it keeps
    ledgers(lay, ran)              the cost ledger of each stage folder that ran (a folder once, in run order)
    summarize(lay, ran, done, ...) summary.json: `done`, the stage folders, the cost of all stages together
    plots(lay, ran, ledgers)       cost_tokens_by_stage (every stage's ledger), then each stage's own plots named
                                   <its folder>_<plot> (PNG bytes)
"""

from __future__ import annotations

import polars as pl

from evolforge.storage.fs import location, read_bytes
from evolforge.storage.ledger import read_ledger
from evolforge.storage.pipeline_sets import PipelineLayout
from evolforge.tasks.core.reporting import cost_summary
from evolforge.tasks.report.plots import cost_and_tokens_by_stage

# what the pipeline's result keeps of a stage's summary: one entry of it (a key), some of its figures (keys), or
# (a stage not named here, e.g. ppo) the whole summary
KEEP: dict[str, str | tuple[str, ...]] = {
    "evolve": "counts",
    "synthesize": ("proposed", "kept", "yield", "models", "warning"),  # which model proposed and validated
    "reward-data": ("irm_pairs", "prm_rows", "health"),
    "train-reward": ("irm", "prm", "metrics"),
    "sft": ("training",),
    "eval": ("table",),
}


def done(ran: dict[str, dict]) -> dict:
    """Per stage that ran ("reward-data" as reward_data), what its summary says it did (KEEP)."""
    out = {}
    for name, summary in ran.items():
        keep = KEEP.get(name)
        out[name.replace("-", "_")] = (summary if keep is None else summary[keep] if isinstance(keep, str)
                                       else {k: summary[k] for k in keep if k in summary})
    return out


def ledgers(lay: PipelineLayout, ran: dict[str, dict]) -> dict[str, pl.DataFrame]:
    """Folder name -> its cost ledger, for each stage folder that ran (the two reward stages share one)."""
    out: dict[str, pl.DataFrame] = {}
    for name in ran:
        folder = lay.stage(name)
        if folder.name not in out:
            out[folder.name] = read_ledger(folder)
    return out


def summarize(lay: PipelineLayout, ran: dict[str, dict], done: dict, ledgers: dict[str, pl.DataFrame]) -> dict:
    """summary.json: what each stage did (`done`), where its folder is, and the cost of every stage's calls."""
    frames = [df for df in ledgers.values() if not df.is_empty()]
    return {**done, "stages": {name: str(lay.stage(name)) for name in ran},
            "cost": cost_summary(pl.concat(frames) if frames else pl.DataFrame())}


def plots(lay: PipelineLayout, ran: dict[str, dict], ledgers: dict[str, pl.DataFrame]) -> dict[str, bytes]:
    """Tokens and cost of every model stage of the pipeline (all stage folders' ledgers), then each stage's own
    plots (the files it wrote), named after its folder: evolve_survival_by_operation, reward_irm_scores, ..."""
    by_stage = []
    for df in ledgers.values():
        by_stage += cost_summary(df).get("by_stage", [])
    out = {"cost_tokens_by_stage": cost_and_tokens_by_stage(by_stage)}
    for name, summary in ran.items():
        prefix = lay.stage(name).name
        out.update({plot if plot.startswith(prefix) else f"{prefix}_{plot}": read_bytes(location(path))
                    for plot, path in (summary.get("plots") or {}).items() if plot != "cost_tokens_by_stage"})
    return out
