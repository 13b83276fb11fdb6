"""`evolforge compare`: the A/B of policies evaluated on the same problems (base vs SFT vs RL).

    evolforge compare base=runs/eval-base sft=runs/eval-sft rl=runs/eval-rl [--reference base] [--out DIR]
                      [--goal sft=5 --goal rl=3]

Each NAME=FOLDER is an eval stage's output folder; the order is the order of the table (each policy is compared with
the one before it, and with --reference). The figures: tasks/eval/compare.py. The eval stage's descriptor names
this command (Stage.commands), and cli/stages.py adds it to the command line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _runs(pairs: list[str]) -> dict[str, str]:
    from evolforge.tasks.core.checks import InputError

    runs: dict[str, str] = {}
    for pair in pairs:
        name, sep, folder = pair.partition("=")
        if not sep or not name.strip() or not folder.strip():
            raise InputError(f"{pair!r}: give each run as NAME=EVAL_OUT (e.g. sft=runs/eval-sft)")
        if name in runs:
            raise InputError(f"{name!r} is named twice")
        if not Path(folder).is_dir():
            raise InputError(f"{folder}: not a folder (an eval stage's --out)")
        runs[name.strip()] = folder.strip()
    return runs


def _goals(pairs: list[str]) -> dict[str, float]:
    from evolforge.tasks.core.checks import InputError

    out = {}
    for pair in pairs:
        name, sep, points = pair.partition("=")
        try:
            out[name.strip()] = float(points)
        except ValueError:
            raise InputError(f"--goal {pair!r}: give NAME=POINTS (e.g. rl=3)") from None
        if not sep or not name.strip():
            raise InputError(f"--goal {pair!r}: give NAME=POINTS (e.g. rl=3)")
    return out


def cmd_compare(args) -> int:
    from evolforge.tasks.core.checks import InputError
    from evolforge.tasks.eval import compare

    try:
        result = compare.compare(_runs(args.runs), args.reference, _goals(args.goal or []))
    except compare.NotComparable as e:
        raise InputError(str(e)) from None
    table = compare.markdown(result)
    print(table, end="")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        (out / "compare.md").write_text(table, encoding="utf-8")
        print(f"written: {out / 'compare.json'}, {out / 'compare.md'}", file=sys.stderr)
    return 0


def register(sub) -> None:
    p = sub.add_parser("compare", help="A/B of eval runs on the same problems: pass@1 per policy with Wilson 95%% "
                       "intervals, each change in points with a paired 95%% interval (RLEIF's +3 points bar)")
    p.add_argument("runs", nargs="+", metavar="NAME=EVAL_OUT", help="eval output folders, in table order")
    p.add_argument("--reference", default=None, help="the policy every other one is also compared with (default: "
                   "the first)")
    p.add_argument("--out", default=None, help="folder for compare.json and compare.md")
    p.add_argument("--goal", action="append", metavar="NAME=POINTS", help="a goal for the change into NAME from the "
                   "policy before it, in points of pass@1 (repeatable); met only when the point estimate reaches it "
                   "and the exact McNemar p < 0.05")
    p.set_defaults(fn=cmd_compare)
