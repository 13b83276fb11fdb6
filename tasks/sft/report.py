"""What an SFT run reports: its summary and the counts stage.json keeps, the plots (loss and learning rate per
step), the dataset card of data/, and the markdown artifact. Plain functions; flows/sft.py writes them.

    summarize(params, prepared, trained, folder)   summary.json
    counts(summary)                                the figures stage.json keeps
    plots(log)                                     sft_loss, sft_learning_rate (PNG bytes)
    card(summary, settings, folder)                the content of data/README.md (configs `train`, `skipped`)
    markdown(summary)                              the `sft-summary` artifact
"""

from __future__ import annotations

from evolforge import __version__
from evolforge.storage import sft_sets as store
from evolforge.storage.ledger import read_ledger
from evolforge.tasks.core.reporting import cost_summary, markdown_table
from evolforge.tasks.report.card import as_yaml, card_cost, card_models
from evolforge.tasks.report.plots import COLORS, empty_plot, integer_ticks, plt, png
from evolforge.tasks.sft.stage import SFTParams

CARD_KEYS = ("require_steps", "min_steps", "trajectory_min_reward", "trajectory_min_turns", "max_rows", "decontaminate",
             "epochs", "max_steps", "learning_rate", "warmup_ratio", "lr_scheduler", "batch_size",
             "gradient_accumulation_steps", "max_length", "completion_only_loss", "seed", "lora", "lora_r",
             "lora_alpha")


def summarize(params: SFTParams, prepared: dict, trained: dict | None, folder: store.SFTFolder) -> dict:
    return {"inputs": {"evolve_out": params.evolve_out, "tasks": params.tasks, "trajectories": params.trajectories},
            "data": {k: v for k, v in prepared.items() if k != "decontamination"},
            "decontamination": prepared.get("decontamination") or {},
            "training": trained,
            "paths": {"train": str(folder.train), "skipped": str(folder.skipped), "model": str(folder.model),
                      "checkpoints": str(folder.checkpoints), "train_log": str(folder.train_log)}}


def counts(summary: dict) -> dict:
    t = summary.get("training") or {}
    return {"rows": summary["data"]["rows"], "skipped": summary["data"]["skipped"], "steps": t.get("steps"),
            "train_loss": t.get("train_loss")}


def plots(log: list[dict]) -> dict[str, bytes]:
    return {"sft_loss": _series(log, "loss", "SFT training loss per step", "loss"),
            "sft_learning_rate": _series(log, "learning_rate", "SFT learning rate per step", "learning rate")}


def _series(log: list[dict], key: str, title: str, ylabel: str) -> bytes:
    pts = [(r["step"], float(r[key])) for r in log if r.get(key) is not None]
    if not pts:
        return empty_plot(title, f"no {ylabel} was logged")
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.plot(*zip(*pts), marker="o" if len(pts) < 40 else None, color=COLORS[0 if key == "loss" else 1])
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    integer_ticks(ax.xaxis)
    ax.grid(alpha=0.3)
    return png(fig)


def card(summary: dict, settings: dict, folder: store.SFTFolder) -> dict:
    sft = {k: settings.get("sft", {}).get(k) for k in CARD_KEYS}
    d, t = summary["data"], summary.get("training") or {}
    cost = cost_summary(read_ledger(folder.root))
    facts = {"stage": "sft", "evolforge_version": __version__, "run_id": summary.get("run_id"),
             "lineage": {**summary["inputs"], "rows": d["rows"], "by_source": d["by_source"]},
             "generation": {"sft": sft}, "models": card_models(cost), "cost": card_cost(cost)}
    decon = summary.get("decontamination") or {}
    sections = {
        "Lineage": [f"Made from the evolve run `{summary['inputs']['evolve_out']}` (its SFT view, answers in step "
                    f"form), the synthesis run `{summary['inputs']['tasks']}` (verified code solutions) and the "
                    f"trajectories `{summary['inputs']['trajectories']}` (every assistant turn of the successful "
                    f"conversations, {d.get('trajectory_conversations', 0)} of them): {d['rows']} rows "
                    "(" + ", ".join(f"{k} {v}" for k, v in d["by_source"].items()) + f"); {d['skipped']} left out "
                    "(`skipped`, by reason: " + (", ".join(f"{k} {v}" for k, v in d["skipped_by_reason"].items())
                                                   or "none") + ")."],
        "Decontamination": ([f"Checked against the evaluation sets by {r['ngram']}-gram overlap: table `{name}`, "
                             f"{r['checked']} rows, {r['overlapping']} overlapping, {r['dropped']} dropped."
                             for name, r in decon.items()] or ["Not checked (sft.decontaminate = off)."]),
        "Generation settings": ["```yaml", *as_yaml(sft).splitlines(), "```"],
        "Training": [f"TRL SFTTrainer from `{t.get('base_model')}`: {t.get('steps')} steps, final loss "
                     f"{t.get('train_loss')}, {t.get('train_seconds')} s on {t.get('device')} ({t.get('dtype')}); "
                     f"the model is `{summary['paths']['model']}`." if t else "Not trained in this run."],
        "Cost": [f"No model was called. Training: {t.get('train_seconds')} s of local compute, priced at "
                 f"{cost.get('cost_usd')} USD (sft.compute_usd_per_hour)." if t else "No model was called."],
    }
    return {"title": "evolforge SFT data",
            "description": "The rows evolforge fine-tuned its policy on (TRL's conversational prompt-completion form: "
                           "`prompt` and `completion` message lists; the loss is on the completion).",
            "sections": sections, "facts": facts, "default": "train"}


def markdown(summary: dict) -> str:
    d, t = summary["data"], summary.get("training") or {}
    lines = ["# SFT stage (TRL SFTTrainer)", "",
             f"Rows: {d['rows']} (" + ", ".join(f"{k} {v}" for k, v in d["by_source"].items()) + f"), "
             f"{d['skipped']} left out.", ""]
    decon = summary.get("decontamination") or {}
    if decon:
        lines += markdown_table(["table", "checked", "overlapping", "dropped"],
                                [[n, r["checked"], r["overlapping"], r["dropped"]] for n, r in decon.items()]) + [""]
    if t:
        lines += [f"Trained {t['steps']} steps ({t.get('steps_this_run')} in this run"
                  + (f", resumed from {t['resumed_from']}" if t.get("resumed_from") else "")
                  + f") from `{t['base_model']}` on {t['device']} ({t['dtype']}): final training loss "
                  f"{t['train_loss']}, {t['train_seconds']} s. Model: `{t['model']}`."]
    return "\n".join(lines)
