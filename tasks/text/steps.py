"""The one step splitter: how an answer becomes the list of steps a PRM is trained on and scored on.

Stdlib only: verl loads tasks/ppo/reward.py by file path, possibly where evolforge is not installed, and
reward.py then loads this file by its location.

Rules (the same for the PRM-data stage, tasks/reward/prm.py, and the PPO reward, tasks/ppo/reward.py):
  1. Step markers: 'Step N' followed by ':', '.', ')', ']', '-', a dash, or the end of the line, also in markdown
     bold ('**Step 1:**', '**Step 1**', '__Step 1__') or as a heading ('### Step 1'), inline or one per line. Only markers
     numbered 1, 2, 3, ... in order count, so a reference such as 'as in step 1.' inside a step is text.
  2. Numbered lines: when fewer than two step markers are found, lines starting '1.' / '1)', '2.' / '2)', ...
     (again numbered in order) are the steps if there are more of them than step markers.
  3. A step is the text after its marker up to the next marker (the last step runs to the end of the text),
     without the marker itself and without surrounding whitespace and markdown '*', '_', '#'. Text before
     the first marker (a preamble such as 'Sure!') belongs to no step.
  4. Marker-less text (no 'Step 1' marker and no '1.' line at all): the PRM-data stage rejects it
     (`steps_or_reason`); for scoring, `split_steps` makes each non-empty line one step (stripped). This rule
     applies ONLY when rules 1 and 2 find no marker, so for every answer the PRM-data stage accepts,
     `split_steps` returns exactly the steps it stored.
"""

from __future__ import annotations

import re

_STEP = re.compile(r"(?:\*\*|__|#+[ \t]*)?(?<![A-Za-z0-9])step[ \t]*(\d{1,3})[ \t]*(?:\*\*|__)?[ \t]*"
                   r"(?:[:.)\]\u2013\u2014-]|\*\*|__|$)[ \t]*(?:\*\*|__)?", re.I | re.M)
_NUMBERED = re.compile(r"^[ \t]*(\d{1,3})[.)][ \t]+", re.M)


def _sequence(matches: list[re.Match]) -> list[re.Match]:
    """Markers numbered 1, 2, 3, ... in order; references like 'as in step 1.' inside a step are skipped."""
    out: list[re.Match] = []
    for m in matches:
        if int(m.group(1)) == len(out) + 1:
            out.append(m)
    return out


def _marked_steps(text: str) -> list[str] | None:
    """The steps by rules 1-3 (a step may be empty here), or None when the text holds no marker at all."""
    marks = _sequence(list(_STEP.finditer(text)))
    if len(marks) < 2:
        marks = max(marks, _sequence(list(_NUMBERED.finditer(text))), key=len)
    if not marks:
        return None
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return [text[m.end():e].strip().strip("*_#").strip() for m, e in zip(marks, ends)]


def steps_or_reason(text: str | None, min_steps: int = 2) -> tuple[list[str] | None, str | None]:
    """(steps, None) when the text is in step form with at least `min_steps` non-empty steps, else
    (None, reason). Marker-less text is rejected here (no line fallback): what the PRM-data stage stores."""
    if not text or not text.strip():
        return None, "empty answer"
    steps = _marked_steps(text)
    if steps is None:
        return None, "no 'Step 1: ... Step 2: ...' markers"
    if any(not s for s in steps):
        return None, "a step is empty"
    if len(steps) < min_steps:
        return None, f"only {len(steps)} step(s)"
    return steps, None


def split_steps(text: str | None, min_steps: int = 1) -> list[str]:
    """The steps of a response, for scoring: rules 1-3, empty steps dropped; for marker-less text one step per
    non-empty line (rule 4). [] for empty text or fewer than `min_steps` steps."""
    if not text or not text.strip():
        return []
    marked = _marked_steps(text)
    if marked is None:
        steps = [line.strip() for line in text.splitlines() if line.strip()]
    else:
        steps = [s for s in marked if s]
    return steps if len(steps) >= min_steps else []
