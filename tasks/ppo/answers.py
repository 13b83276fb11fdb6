"""Parsing a response for the PPO reward: its steps and its final answer, and the rule-based answer check.

Self-contained (stdlib only): verl loads tasks/ppo/reward.py by path, which imports this file as a sibling.
"""

from __future__ import annotations

import re

_STEP = re.compile(r"\bstep\s*\d+\s*:", re.I)
_ANSWER_IS = re.compile(r"the\s+answer\s+is\s*:?\s*(.+)", re.I)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


def split_steps(text: str) -> list[str]:
    """'Step 1: ... Step 2: ...' -> one string per step (text before Step 1 is its own step);
    without step markers, one step per non-empty line."""
    text = (text or "").strip()
    if not text:
        return []
    starts = [m.start() for m in _STEP.finditer(text)]
    if not starts:
        return [line.strip() for line in text.splitlines() if line.strip()]
    pieces = [text[:starts[0]]] + [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)])]
    return [p.strip() for p in pieces if p.strip()]


def extract_answer(text: str | None, fallback_last_number: bool = False) -> str | None:
    """The final answer of a response: the last 'The answer is: X', else the last \\boxed{X},
    else (with fallback_last_number) the last number in the text."""
    if not text:
        return None
    found = [m.group(1) for m in _ANSWER_IS.finditer(text)]
    if found:
        ans = found[-1].splitlines()[0] if found[-1].strip() else ""
    else:
        boxed = _BOXED.findall(text)
        if boxed:
            ans = boxed[-1]
        elif fallback_last_number:
            nums = _NUMBER.findall(text.replace(",", ""))
            ans = nums[-1] if nums else ""
        else:
            return None
    ans = _BOXED.sub(lambda m: m.group(1), ans).strip().strip("$").strip().rstrip(".").strip()
    return ans or None


def _as_number(s: str) -> float | None:
    m = _NUMBER.search(s.replace(",", "").replace("$", ""))
    if not m:
        return None
    tok = m.group(0)
    try:
        if "/" in tok:
            a, b = tok.split("/")
            return float(a) / float(b) if float(b) else None
        return float(tok)
    except ValueError:
        return None


def answers_match(predicted: str | None, ground_truth: str) -> bool:
    """Numeric comparison when the ground truth is a number (relative tolerance 1e-6), else a
    case-, space- and punctuation-insensitive string comparison."""
    if predicted is None:
        return False
    gt_num = _as_number(ground_truth) if re.fullmatch(r"\s*\$?-?[\d,]+(?:\.\d+)?(?:/\d+)?\s*%?\s*", ground_truth) else None
    if gt_num is not None:
        p = _as_number(predicted)
        return p is not None and abs(p - gt_num) <= 1e-6 * max(1.0, abs(gt_num))
    norm = lambda s: re.sub(r"[\s.,;:!$]+", "", s.lower())  # noqa: E731
    return norm(predicted) == norm(ground_truth)


def answer_correct(response: str, ground_truth: str | None) -> bool | None:
    """True / False against a ground truth; None when there is no ground truth to check."""
    if not ground_truth or not str(ground_truth).strip():
        return None
    return answers_match(extract_answer(response, fallback_last_number=True), str(ground_truth))
