"""What an SFT run does around the trainer: its rows (once per output folder), and its cost in the ledger.

    prepare(params, settings, folder)   the inputs read, the held-out seed lineages (the PPO stage's test split over
                                        the same evolve run and tasks), the evaluation sets' n-gram index, then
                                        data/train.parquet, data/skipped.parquet and decontamination.json (tasks/sft/
                                        data.py); with --irm-dir and reward.select_by_irm on, only the evolved rows
                                        the IRM selects (tasks/reward/selection.py); with --prm-dir and
                                        reward.prm_min_step > 0, only the evolved answers whose every step the PRM
                                        accepts (the same module); with sft.rejection_samples,
                                        the base policy's verified answers to the training tasks (tasks/sft/
                                        rejection.py, every sample in data/rejection_samples.parquet). An output
                                        folder that has its rows keeps them: a resumed run trains on exactly the
                                        rows its checkpoints were trained on.
    record_cost(folder, run_id, ...)    one ledger row for the training run: wall seconds, tokens trained on, cost
                                        = hours x sft.compute_usd_per_hour (0: local compute at $0)
"""

from __future__ import annotations

from evolforge.config.settings import Settings
from evolforge.storage import sft_sets as store
from evolforge.storage.fs import exists, local_copy, location
from evolforge.storage.inputs import input_exists
from evolforge.storage.ledger import LedgerWriter
from evolforge.storage.reward_sets import META_FILE
from evolforge.storage.synthesis_sets import read_kept_tasks
from evolforge.tasks.core.progress import StepProgress
from evolforge.tasks.problems.benchmarks import eval_index, held_out_seeds, own_problems
from evolforge.tasks.reward.selection import irm_selection, prm_filter
from evolforge.tasks.sft import data, rejection, train
from evolforge.tasks.sft.stage import SFTParams, inputs
from evolforge.tasks.text.steps import steps_or_reason


def prepare(params: SFTParams, settings: Settings, folder: store.SFTFolder) -> dict:
    """The rows to train on (see the module docstring); returns the counts and the decontamination reports."""
    if exists(folder.train):
        rows, skipped = store.read_rows(folder.train), store.read_table_rows(folder.skipped)
        built = data.Built(rows, skipped, store.read_json(folder.decontamination) or {})
        return {**built.counts(), "reused": True, "held_out_seeds": None, "decontamination": built.decontamination}
    paths = inputs(params)
    view = store.read_table_rows(paths["sft_view"]) if paths["sft_view"] else []
    evolved = store.read_table_rows(paths["evolved"]) if paths["evolved"] and input_exists(paths["evolved"]) else []
    tasks = read_kept_tasks(paths["tasks"]) if paths["tasks"] else []
    conversations = store.read_jsonl(paths["trajectories"]) if paths["trajectories"] else []
    held_out = held_out_seeds(evolved, tasks, settings.ppo)
    index = (eval_index(settings.eval, extra=own_problems(tasks, held_out))  # + the held-out verified tasks
             if settings.sft.decontaminate != "off" else None)
    selection, picked = None, None
    if params.irm_dir and settings.reward.select_by_irm != "off":  # the PPO stage's rule over the same pool
        pool = evolved or [{"id": r["id"], "status": "accepted", "instruction": data.user_text(r)} for r in view]
        irm = local_copy(location(params.irm_dir), marker=META_FILE)  # a remote folder: downloaded (cached)
        selection, picked = irm_selection(pool, irm, settings.reward)
    prm, prm_summary = None, None
    rcfg = settings.reward
    if params.prm_dir and (rcfg.prm_min_step > 0 or rcfg.prm_keep_share > 0):  # the answers nothing else verified
        prm, prm_summary = prm_filter(prm_rows(view, held_out, settings.sft),
                                      local_copy(location(params.prm_dir), marker=META_FILE),
                                      rcfg.prm_min_step, rcfg.prm_keep_share)
    sampled, rejection = None, None
    if settings.sft.rejection_samples and tasks:  # the policy's own verified answers (RFT)
        sampled, rejection = rejection_sample(tasks, held_out, settings, folder)
    built = data.build(view, tasks, conversations, held_out, settings.sft, index, selection, sampled, prm)
    store.write_skipped(built.skipped, folder.skipped)
    store.write_json(folder.decontamination, built.decontamination)
    store.write_rows(built.rows, folder.train)  # last: its presence means the rows are complete
    return {**built.counts(), "reused": False, "held_out_seeds": len(held_out), "decontamination": built.decontamination,
            "irm_selection": picked, "prm_filter": prm_summary, "rejection_sampling": rejection}


def prm_rows(view: list[dict], held_out: set[str], cfg) -> list[tuple[str, str, list[str]]]:
    """(id, instruction, steps) of each SFT-view answer the PRM is asked about: not held out, in step form."""
    rows = []
    for r in view:
        if (r.get("seed_id") or r.get("id")) in held_out:
            continue
        steps, _ = steps_or_reason(data.assistant_text(r), cfg.min_steps)
        if steps:
            rows.append((str(r["id"]), data.user_text(r), steps))
    return rows


def rejection_sample(tasks: list[dict], held_out: set[str], settings: Settings,
                     folder: store.SFTFolder) -> tuple[dict[str, list[str]], dict]:
    """sft.rejection_samples answers of the base policy per training task, verified (tasks/sft/rejection.py);
    every sample with its verdict goes to data/rejection_samples.parquet. Returns (task_id -> kept answers, counts)."""
    from evolforge.tasks.core.policy import LocalPolicy

    cfg = settings.sft
    todo = rejection.training_tasks(tasks, held_out)
    policy = LocalPolicy(train.base_policy(cfg, settings.ppo, folder), rejection.sampling_settings(cfg))
    progress = StepProgress("rejection sampling", len(todo), "tasks")
    rows, kept = rejection.sample(todo, policy, cfg, settings.sandbox, on_batch=lambda k: progress.update(advance=k))
    progress.finish()
    store.write_rejection_samples(rows, folder.rejection_samples)
    gen = {**policy.stats, "seconds": round(policy.stats["seconds"], 2),
           "tokens_per_second": round(policy.tokens_per_second(), 2), "batch_size": cfg.rejection_batch_size}
    return kept, {**rejection.counts(rows, kept), "generation": gen}


def record_cost(folder: store.SFTFolder, run_id: str, result: dict, usd_per_hour: float) -> None:
    """The training run as one ledger row (stage sft, task_id train): what `evolforge costs` and the card show."""
    ledger = LedgerWriter(folder.ledger_dir, run_id)
    seconds = float(result.get("train_seconds") or 0.0)
    ledger.record(stage="sft", task_id="train", model=result.get("base_model"), attempt=1, outcome="ok",
                  prompt_tokens=result.get("tokens") or 0, completion_tokens=0,
                  cost_usd=round(seconds / 3600 * usd_per_hour, 6),
                  price_source=f"local compute: {usd_per_hour} USD/hour (sft.compute_usd_per_hour)",
                  latency_s=round(seconds, 3))
    ledger.close()
