"""Reproducible randomness: one RNG per (seed, record, purpose), the same on every resume and worker."""

from __future__ import annotations

import hashlib
import random


def seeded_rng(seed: int, *parts: object) -> random.Random:
    """A `random.Random` drawn from sha256("seed:part1:part2:..."): independent of process, order and hash seed."""
    digest = hashlib.sha256(":".join(str(p) for p in (seed, *parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))
