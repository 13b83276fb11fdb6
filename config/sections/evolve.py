"""Evol-Instruct and the seed input."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from evolforge.config.sections._base import Section


class EvolInstructSettings(Section):
    """Evol-Instruct as in WizardLM / WizardMath (names follow the published RLEIF config)."""

    rounds: int = Field(4, ge=1, le=64, description="Evolution rounds per run.")
    evolve_up_ratio: float = Field(0.7, ge=0, le=1, description="Share of evolutions that go upward (in-depth or in-breadth).")
    evolve_down_ratio: float = Field(0.3, ge=0, le=1, description="Share that go downward (easier; new easier topic).")
    in_breadth_share: float = Field(
        1 / 6, ge=0, le=1, description="Share of upward evolutions that are in-breadth (a brand-new rarer prompt)."
    )
    code_operations: bool = Field(True, description="Seeds of domain 'code' use the WizardCoder operations when evolving upward.")
    temperature: float = Field(0.9, ge=0, le=2, description="Sampling temperature of the evolve and answer calls (the judge uses 0).")
    top_p: float = Field(0.95, gt=0, le=1, description="Nucleus sampling of the evolve and answer calls.")
    max_new_tokens: int = Field(1024, ge=8, le=32768, description="Completion cap for evolve and answer calls.")
    batch_size: int = Field(128, ge=1, le=100_000, description="Records per batch; one Prefect task and one parquet part per batch.")
    concurrency: int = Field(8, ge=1, le=1024, description="Records in flight inside one batch.")
    seed: int = Field(42, description="Seed of the RNG that picks operations (per record, reproducible on resume).")
    equal_check: bool = Field(True, description="Elimination rule 1: ask the judge whether the evolution is Equal to its parent.")
    equal_judge: Literal["auto", "model", "words"] = Field(
        "auto", description="Who decides rule 1. 'model': the judge model, asked WizardLM's Equal prompt. 'words': "
        "no call; the evolution is Equal to its parent when it adds no word the parent lacks (stop words aside). "
        "'auto': 'words' on the embedded model (its 135M judge answers Equal to every pair, changed or not), "
        "'model' on any other endpoint.")
    unparseable_verdict: Literal["keep", "eliminate"] = Field(
        "keep", description="What an Equal-judge reply that says neither 'Equal' nor 'Not Equal' does (always counted)."
    )
    answer: bool = Field(True, description="Answer each evolution (needed for elimination rules 2 and 3; written as `answer`).")
    answer_in_steps: bool = Field(True, description="Ask for answers in 'Step 1: ... Step 2: ...' form (what a PRM needs).")
    sorry_max_words: int = Field(80, ge=1, description="Rule 2: an answer containing 'sorry' with fewer words than this fails.")
    dedup_each_round: bool = Field(
        True, description="After every round, drop accepted evolutions that duplicate anything accepted so far "
        "(this run and earlier nights; methods and thresholds in [dedup]). Dropped ones return their parent to the pool.")

    @model_validator(mode="after")
    def _ratios_sum_to_one(self) -> "EvolInstructSettings":
        total = self.evolve_up_ratio + self.evolve_down_ratio
        if abs(total - 1.0) > 1e-6:
            raise ValueError(
                f"evolve_up_ratio ({self.evolve_up_ratio}) + evolve_down_ratio ({self.evolve_down_ratio}) must be 1.0, got {total}"
            )
        return self


class InputSettings(Section):
    """How seed datasets are read (jsonl, parquet or csv)."""

    instruction_field: str = Field("instruction", description="Column holding the instruction text.")
    id_field: str = Field("id", description="Optional column with a stable record id; missing ids are derived from the text.")
    domain_field: str = Field("domain", description="Optional column: math, code or general (else guessed).")
    max_chars: int = Field(20_000, ge=1, description="Longer instructions are rejected (to the rejects file).")
