"""The SFT rows: what the policy is fine-tuned on, in TRL's conversational prompt-completion form.

Sources (each optional but one):
  evolved        an evolve run's SFT view (dataset/sft/train.parquet: user instruction, assistant answer). The
                 answer must be in the step form the PRM was trained on ('Step 1: ... Step 2: ...', the one step
                 splitter of tasks/text/steps.py); the prompt becomes the step-by-step answer prompt the PPO data
                 uses (tasks/problems/prompts.py answer_messages), so SFT, PPO and the PRM see one format.
  synthesis_code a kept code task of the synthesis stage: the solver prompt (tasks/problems/prompts.py SOLVE_CODE)
                 and its reference solution, which passed the task's own tests in the sandbox. Kept math tasks have
                 a verified final answer but no stored worked solution: they are skipped with that reason (no
                 answer is written by hand).
  trajectory     a recorded agent conversation (the trajectories stage's sft.jsonl) whose reward is at least
                 sft.trajectory_min_reward and that has at least sft.trajectory_min_turns assistant turns: one row
                 per assistant turn, everything before that turn the prompt, the turn (text and tool calls) the
                 completion, so the loss falls on every assistant turn and on nothing else.
Left out, with the reason (data/skipped.parquet): evolved rows the IRM did not select (reward.select_by_irm with
--irm-dir: tasks/reward/selection.py; the reason holds the score and rank), answers not in step form, a seed
lineage held out for evaluation (the PPO stage's test split over the same evolve run and tasks:
tasks/problems/split.py), a row sharing an n-gram with an evaluation set (sft.decontaminate = drop), repeats of a prompt already taken.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from evolforge.config.sections.sft import SFTSettings
from evolforge.storage.sft_sets import message
from evolforge.tasks.problems.prompts import answer_messages, task_messages
from evolforge.tasks.text.chat import text_and_images, tool_call
from evolforge.tasks.text.ngrams import NgramIndex, check_table
from evolforge.tasks.text.steps import steps_or_reason

SOURCES = ("evolved", "synthesis_code", "rejection_sampled", "trajectory")


@dataclass
class Built:
    """The rows of one build: kept rows, skipped rows (with reasons), and per-table decontamination reports."""

    rows: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    decontamination: dict[str, dict] = field(default_factory=dict)

    def skip(self, row_id, source: str, seed_id, reason: str, text: str = "") -> None:
        self.skipped.append({"id": str(row_id), "source": source, "seed_id": seed_id, "reason": reason,
                             "text": (text or "")[:500]})

    def counts(self) -> dict:
        by_source = {s: sum(r["source"] == s for r in self.rows) for s in SOURCES}
        reasons: dict[str, int] = {}
        for s in self.skipped:
            key = s["reason"].split(":")[0]
            reasons[key] = reasons.get(key, 0) + 1
        conversations = {r["id"].rsplit("/", 1)[0] for r in self.rows if r["source"] == "trajectory"}
        return {"rows": len(self.rows), "by_source": by_source, "trajectory_conversations": len(conversations),
                "skipped": len(self.skipped), "skipped_by_reason": reasons}


def _content(messages: list[dict], role: str) -> str:
    return next((m.get("content") or "" for m in messages if m.get("role") == role), "")


def user_text(view_row: dict) -> str:
    """The instruction of an SFT-view row (its user turn)."""
    return _content(view_row["messages"], "user")


def assistant_text(view_row: dict) -> str:
    """The answer of an SFT-view row (its assistant turn)."""
    return _content(view_row["messages"], "assistant")


def evolved_rows(view: list[dict], held_out: set[str], cfg: SFTSettings, out: Built,
                 selection: dict[str, dict] | None = None, prm: dict[str, dict] | None = None) -> list[dict]:
    rows = []
    for r in view:
        instruction, answer = _content(r["messages"], "user"), _content(r["messages"], "assistant")
        seed = r.get("seed_id") or r.get("id")
        if seed in held_out:
            out.skip(r["id"], "evolved", seed, "held-out lineage: its seed is evaluated")
            continue
        if cfg.require_steps:
            steps, why = steps_or_reason(answer, cfg.min_steps)
            if steps is None:
                out.skip(r["id"], "evolved", seed, f"not step form: {why}", answer)
                continue
        picked = (selection or {}).get(str(r["id"]))
        if selection is not None and not (picked and picked["irm_selected"]):
            why = (f"IRM score {picked['irm_score']} (rank {picked['irm_rank']} of {len(selection)})" if picked
                   else "not in the scored pool")
            out.skip(r["id"], "evolved", seed, f"not selected by the IRM: {why}", instruction)
            continue
        judged = (prm or {}).get(str(r["id"]))
        if prm is not None and not (judged and judged["prm_kept"]):
            rank = f" (rank {judged['prm_rank']} of {len(prm)})" if judged and judged.get("prm_rank") else ""
            why = (f"step {judged['prm_step']} scored {judged['prm_min']}{rank}" if judged and judged["prm_min"] is not None
                   else "not scored")
            out.skip(r["id"], "evolved", seed, f"a step the PRM doubts: {why}", answer)
            continue
        rows.append({"id": str(r["id"]), "source": "evolved", "seed_id": seed, "domain": r.get("domain") or "general",
                     "prompt": [message(m["role"], m["content"]) for m in answer_messages(instruction, True)],
                     "completion": [message("assistant", answer.strip())]})
    return rows


def task_rows(tasks: list[dict], held_out: set[str], out: Built,
              sampled: dict[str, list[str]] | None = None) -> list[dict]:
    """Kept synthesis tasks -> rows: a code task's reference solution, and every task's verified rejection samples
    (`sampled`: task_id -> the policy's own verified answers, tasks/sft/rejection.py)."""
    rows = []
    for t in tasks:
        seed, tid = t.get("seed_id") or t.get("task_id"), str(t["task_id"])
        if seed in held_out:
            out.skip(tid, f"synthesis_{t.get('kind')}", seed, "held-out lineage: its seed is evaluated")
            continue
        before = len(rows)
        code = t.get("kind") == "code" and (t.get("entry_point") or "").strip()
        statement = (t.get("statement") or "").strip()
        prompt = [message(m["role"], m["content"]) for m in task_messages(t.get("kind"), statement, t.get("entry_point"))]
        if code and (t.get("solution") or "").strip():
            rows.append({"id": tid, "source": "synthesis_code", "seed_id": seed, "domain": "code", "prompt": prompt,
                         "completion": [message("assistant", f"```python\n{t['solution'].strip()}\n```")]})
        for j, answer in enumerate((sampled or {}).get(tid, [])):
            rows.append({"id": f"{tid}/rs{j}", "source": "rejection_sampled", "seed_id": seed,
                         "domain": "code" if code else "math", "prompt": prompt,
                         "completion": [message("assistant", answer)]})
        if len(rows) == before:
            out.skip(tid, f"synthesis_{t.get('kind')}", seed,
                     ("no verified sample: none of the policy's answers passed the check (sft.rejection_samples)"
                      if sampled is not None else
                      "no stored worked solution: the synthesis stage keeps a math task's verified answer, not steps "
                      "(sft.rejection_samples > 0 samples verified answers)") if t.get("kind") == "math" else
                     "no verified solution")
    return rows


def trajectory_rows(conversations: list[dict], cfg: SFTSettings, out: Built) -> list[dict]:
    """Successful recorded conversations -> one row per assistant turn: the messages before the turn are the prompt,
    the turn (its text and tool calls) the completion, so every assistant turn is learnt once and the system, user
    and tool turns only ever sit in prompts. A conversation is successful at a reward of at least
    sft.trajectory_min_reward and with at least sft.trajectory_min_turns assistant turns (a turn with text or tool
    calls; an empty one is never a completion)."""
    rows = []
    for c in conversations:
        cid = str(c.get("conversation_id") or c.get("session"))
        reward = _number(c.get("reward"))
        msgs = c.get("messages") if isinstance(c.get("messages"), list) else []
        conv = [_turn(m) for m in msgs if isinstance(m, dict)]
        turns = [i for i, m in enumerate(conv) if m["role"] == "assistant" and (m["content"] or m["tool_calls"])]
        if reward is None or reward < cfg.trajectory_min_reward:
            out.skip(cid, "trajectory", None, f"not successful: reward {reward} < {cfg.trajectory_min_reward}"
                     if reward is not None else "not successful: no reward" if c.get("reward") is None else
                     f"not successful: reward {str(c.get('reward'))[:40]!r} is not a number")
        elif not turns:
            out.skip(cid, "trajectory", None, "no assistant turn to learn")
        elif len(turns) < cfg.trajectory_min_turns:
            out.skip(cid, "trajectory", None, f"too few assistant turns: {len(turns)} < {cfg.trajectory_min_turns} "
                     "(sft.trajectory_min_turns)")
        else:
            tools = _tools_json(c.get("tools"))
            for i in turns:
                rows.append({"id": f"{cid}/{i}", "source": "trajectory", "seed_id": None, "domain": "agent",
                             "prompt": conv[:i], "completion": [conv[i]], "tools": tools})
    return rows


def _number(v) -> float | None:
    """A reward as a number; anything else (a hand-edited sft.jsonl's "high", true, NaN) counts as no reward."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        return None
    return float(v)


def _tools_json(tools) -> str | None:
    """The tool schemas as one JSON text (sft.jsonl holds them so), or None when they are not a list of schemas."""
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except ValueError:
            return None
    ok = isinstance(tools, list) and tools and all(isinstance(t, dict) for t in tools)
    return json.dumps(tools, ensure_ascii=False) if ok else None


def _turn(m: dict) -> dict:
    """A recorded message as SFT_SCHEMA stores it. A text policy: a turn's images (TRL multimodal parts in sft.jsonl)
    are left out, its text kept; tool calls in the OpenAI form (arguments a JSON string), whatever their shape."""
    calls = m.get("tool_calls")
    if isinstance(calls, list):
        calls = [tool_call(tc, i) for i, tc in enumerate(calls) if isinstance(tc, dict)]
    else:
        calls = None
    call_id = m.get("tool_call_id")
    return message(str(m.get("role") or "user"), text_and_images(m.get("content"))[0], calls,
                   str(call_id) if call_id is not None else None)


def row_text(row: dict) -> str:
    """A row's text: its messages' contents and tool calls (what decontamination and the repeat check read)."""
    return "\n".join((m.get("content") or "") + (f"\n{m['tool_calls']}" if m.get("tool_calls") else "")
                     for m in row["prompt"] + row["completion"])


def decontaminate(tables: dict[str, list[dict]], index: NgramIndex | None, mode: str,
                  out: Built) -> dict[str, list[dict]]:
    """Each table checked against the evaluation sets (report per table); overlapping rows dropped under 'drop'."""
    if index is None or mode == "off":
        return tables
    kept = {}
    for name, rows in tables.items():
        flags, report = check_table(name, rows, row_text, index)
        report["dropped"] = report["overlapping"] if mode == "drop" else 0
        out.decontamination[name] = report
        kept[name] = []
        for row, hit in zip(rows, flags):
            if hit and mode == "drop":
                out.skip(row["id"], row["source"], row["seed_id"], "overlaps an evaluation set (n-gram)", row_text(row))
            else:
                kept[name].append(row)
    return kept


def build(view: list[dict], tasks: list[dict], conversations: list[dict], held_out: set[str], cfg: SFTSettings,
          index: NgramIndex | None, selection: dict[str, dict] | None = None,
          sampled: dict[str, list[str]] | None = None, prm: dict[str, dict] | None = None) -> Built:
    """Every source -> the rows to train on (deduplicated by prompt, or by prompt and answer for a task's several
    answers, seeded order, at most sft.max_rows); with an IRM `selection` (id -> irm_selected ...), only the selected
    evolved rows; with a PRM filter `prm` (id -> prm_kept ...), only the evolved answers whose every step the PRM
    accepts; with `sampled` (rejection sampling), the tasks' verified samples."""
    out = Built()
    tables = {"evolved": evolved_rows(view, held_out, cfg, out, selection, prm),
              "synthesis": task_rows(tasks, held_out, out, sampled),
              "trajectories": trajectory_rows(conversations, cfg, out)}
    tables = decontaminate(tables, index, cfg.decontaminate, out)
    seen: set[str] = set()
    for rows in tables.values():
        for r in rows:
            key = " ".join(row_text({"prompt": r["prompt"], "completion": r["completion"] if r["source"] in
                                     ("synthesis_code", "rejection_sampled") else []}).lower().split())
            if key in seen:
                out.skip(r["id"], r["source"], r["seed_id"], "repeated prompt")
                continue
            seen.add(key)
            out.rows.append(r)
    random.Random(cfg.seed).shuffle(out.rows)
    if cfg.max_rows and len(out.rows) > cfg.max_rows:
        for r in out.rows[cfg.max_rows:]:
            out.skip(r["id"], r["source"], r["seed_id"], f"over sft.max_rows ({cfg.max_rows})")
        out.rows = out.rows[:cfg.max_rows]
    return out
