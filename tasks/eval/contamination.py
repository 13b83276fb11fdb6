"""Which training tables overlap the evaluation sets: each training folder given to the eval (`--training`) is read
by its stage (its stage.json kind), and every table it holds is checked by word n-gram overlap (tasks/text/ngrams.py)
against the problems this evaluation ran. Reported per table; nothing is dropped here (the SFT and PPO stages drop
overlapping rows from what they train on: sft.decontaminate, ppo.decontaminate).

    TABLES                       stage kind -> (table name, how its file is found, the text of a row)
    training_tables(folder)      the tables of one training folder: name -> rows, text of a row
    report(folders, problems, n) one report per table: checked, overlapping, by evaluation set, examples
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from evolforge.storage.eval_sets import read_rows
from evolforge.storage.folder import read_marker
from evolforge.storage.layout import RunLayout
from evolforge.storage.ppo import PPOLayout
from evolforge.storage.sft_sets import SFTFolder
from evolforge.storage.synthesis_sets import SynthLayout
from evolforge.tasks.problems.benchmarks import Problem
from evolforge.tasks.text.ngrams import NgramIndex, check_table


def _messages(r: dict) -> str:
    return "\n".join(m.get("content") or "" for m in (r.get("prompt") or []) + (r.get("completion") or []))


TABLES: dict[str, tuple[str, Callable[[str], Path], Callable[[dict], str]]] = {
    "evolve": ("evolved", lambda f: RunLayout(f).evolved,
               lambda r: f"{r.get('instruction') or ''}\n{r.get('answer') or ''}"),
    "synthesize": ("synthesis", lambda f: SynthLayout(f).tasks,
                   lambda r: f"{r.get('statement') or ''}\n{r.get('solution') or ''}\n{r.get('answer') or ''}"),
    "sft": ("sft", lambda f: SFTFolder(f).train, _messages),
    "ppo": ("ppo", lambda f: PPOLayout(f).train,
            lambda r: f"{r['extra_info'].get('question') or ''}\n{r['extra_info'].get('answer') or ''}"),
}


def training_tables(folder: str) -> tuple[str, list[dict], Callable[[dict], str]]:
    """(table name, rows, text of a row) of a training folder, by its stage.json kind."""
    kind = (read_marker(folder) or {}).get("kind")
    if kind not in TABLES:
        raise ValueError(f"{folder}: not a training folder (stage.json kind {kind!r}; known: {', '.join(TABLES)})")
    name, path_of, text_of = TABLES[kind]
    return name, read_rows(path_of(folder)) or [], text_of


def report(folders: list[str], problems: dict[str, list[Problem]], n: int) -> list[dict]:
    index = NgramIndex(n)
    for items in problems.values():
        for p in items:
            index.add(p.benchmark, p.id, p.text)
    out = []
    for folder in folders:
        name, rows, text_of = training_tables(folder)
        _, rep = check_table(name, rows, text_of, index,
                             id_of=lambda r: str(r.get("id") or r.get("task_id") or
                                                 (r.get("extra_info") or {}).get("lineage", {}).get("id")))
        out.append({**rep, "folder": str(folder)})
    return out
