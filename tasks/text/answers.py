"""The one answer extractor and answer comparison: the final answer of a response, and whether it matches.

Stdlib only: verl loads tasks/ppo/reward.py by file path, possibly where evolforge is not installed, and
reward.py then loads this file by its location.

Used by the PRM-data stage (tasks/reward/prm.py, Math-Shepherd rollouts), the PPO data and reward
(tasks/ppo/data.py ground truths, tasks/ppo/reward.py answer check) and task synthesis
(tasks/text/checks.py, which evaluates the extracted text as arithmetic).

Final-answer markers (the one that occurs LAST in the text wins):
  - 'The answer is X', 'The final answer is: X', 'Final answer: X'  (X = the rest of that line);
  - a GSM8K line '#### X'  (a markdown heading '#### Step N' is not an answer);
  - LaTeX '\\boxed{X}'  (nested braces allowed).
X is cleaned: an inner \\boxed{...} is unwrapped; surrounding whitespace, '$' and markdown '*' and a trailing '.'
are dropped. With `fallback_last_number`, a text without any marker answers its last number.
"""

from __future__ import annotations

import re

_ANSWER_IS = re.compile(r"(?:\bthe\s+(?:final\s+)?answer\s+is\b|\bfinal\s+answer(?=\s*:))\s*:?\s*(.+)", re.I)
_HASHES = re.compile(r"^[ \t]*####(?!#)[ \t]*(?!step[ \t]*\d)(\S[^\n]*)", re.I | re.M)
_BOXED = "\\boxed{"
_NUMBER = re.compile(r"(?<![A-Za-z_])-?\d+(?:\.\d+)?(?:/\d+)?")
_NUMERIC = re.compile(r"\s*(?:[A-Za-z]\w*\s*=\s*)?[-+]?\$?\s*-?\d[\d,]*(?:\.\d+)?(?:/\d+)?\s*%?\s*")


def _boxed(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of every \\boxed{...}, braces balanced."""
    out, i = [], text.find(_BOXED)
    while i >= 0:
        depth, j = 1, i + len(_BOXED)
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        if depth:
            break  # unbalanced: no more complete boxes
        out.append((i, j, text[i + len(_BOXED):j - 1]))
        i = text.find(_BOXED, j)
    return out


def _clean(ans: str) -> str:
    for start, end, inner in reversed(_boxed(ans)):
        ans = ans[:start] + inner + ans[end:]
    prev = None
    while prev != ans:
        prev, ans = ans, ans.strip().strip("$*").rstrip(".")
    return ans


def extract_answer(text: str | None, fallback_last_number: bool = False) -> str | None:
    """The final answer of a response (see the module doc), else (with fallback_last_number) its last number,
    else None."""
    if not text:
        return None
    found = [(m.start(), m.group(1)) for m in _ANSWER_IS.finditer(text)]
    found += [(m.start(), m.group(1)) for m in _HASHES.finditer(text)]
    found += [(start, inner) for start, _, inner in _boxed(text)]
    for _, raw in sorted(found, key=lambda f: f[0], reverse=True):
        ans = _clean(raw)
        if ans:
            return ans
    if fallback_last_number:
        nums = _NUMBER.findall(text.replace(",", ""))
        return nums[-1] if nums else None
    return None


def parse_number(s: str | None) -> float | None:
    """The first number in `s` ('$1,200.00' -> 1200.0, '3/4' -> 0.75, 'x = 3' -> 3.0), else None."""
    m = _NUMBER.search((s or "").replace(",", "").replace("$", ""))
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


def numeric_value(s: str | None) -> float | None:
    """The value of `s` when it is just a number ('1,200', '$5', '3/4', '50%', 'x = 3'), else None."""
    if s is None or not _NUMERIC.fullmatch(s.strip().rstrip(".")):
        return None
    return parse_number(s)


def same_number(a: float | None, b: float | None, rel: float = 1e-6) -> bool:
    """Equal within a relative tolerance (absolute below 1); False when either is None."""
    return a is not None and b is not None and abs(a - b) <= rel * max(1.0, abs(a), abs(b))


def _norm(s: str) -> str:
    return re.sub(r"[\s.,;:!$*]+", "", s.lower())


def answers_match(predicted: str | None, ground_truth: str | None) -> bool:
    """Numeric comparison (relative tolerance 1e-6) when the ground truth is a number, comparing the first
    number of the prediction; else a case-, space- and punctuation-insensitive string comparison."""
    if predicted is None or ground_truth is None:
        return False
    predicted, ground_truth = str(predicted), str(ground_truth)
    gt = numeric_value(ground_truth)
    if gt is not None:
        return same_number(parse_number(predicted), gt)
    return _norm(predicted) == _norm(ground_truth)


def answer_correct(response: str | None, ground_truth: str | None) -> bool | None:
    """True / False against a ground truth (the response's final answer, else its last number);
    None when there is no ground truth to check."""
    if not ground_truth or not str(ground_truth).strip():
        return None
    return answers_match(extract_answer(response, fallback_last_number=True), str(ground_truth))
