"""Verified task synthesis."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from evolforge.config.sections._base import Section


class SynthesisSettings(Section):
    """Verified task synthesis: propose -> sandboxed tests -> repair loop -> independent solver (KodCode style)."""

    kinds: Literal["auto", "code", "math"] = Field(
        "auto", description="Task kind per seed: auto (math seeds -> math word problems, others -> Python tasks), or force one.")
    max_repairs: int = Field(3, ge=0, le=20, description="Repair calls after the first failing test run.")
    budget_usd_per_task: float = Field(0.25, ge=0, description="Stop working on a task once its model calls cost this (0: no cost budget).")
    budget_seconds_per_task: float = Field(600.0, gt=0, description="Stop working on a task after this many wall seconds.")
    solver_attempts: int = Field(3, ge=1, le=20, description="k: independent solver attempts; pass rate labels difficulty.")
    temperature: float = Field(0.7, ge=0, le=2, description="Sampling temperature of proposals.")
    solver_temperature: float = Field(0.8, ge=0, le=2, description="Sampling temperature of solver attempts.")
    max_new_tokens: int = Field(768, ge=16, le=32768, description="Completion cap of synthesis calls.")
    prune_jaccard: float = Field(0.9, gt=0, le=1, description="Proposals this similar (5-char shingle Jaccard) to an earlier one of the batch are pruned before any test run.")
    batch_size: int = Field(8, ge=1, le=10_000, description="Seeds per batch (one Prefect task and one part per batch).")
    concurrency: int = Field(2, ge=1, le=256, description="Tasks in flight inside one batch.")
