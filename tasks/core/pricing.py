"""Cost in USD of one model call.

Order: the embedded model is free (and the ledger says so); then an override
from `[pricing.overrides."MODEL"]` in config; then the genai-prices database.
A model found in neither has cost None (null in the ledger) and one warning per
model name: unknown never becomes a silent 0.
"""

from __future__ import annotations

import logging
import threading
from functools import lru_cache

from evolforge.config.settings import PricingSettings

log = logging.getLogger("evolforge.pricing")

EMBEDDED = "embedded model (free)"
OVERRIDE = "config override"
DATABASE = "genai-prices"
UNKNOWN = "unknown model"


class PriceBook:
    def __init__(self, pricing: PricingSettings, embedded_models: set[str] | frozenset = frozenset()):
        self.pricing = pricing
        self.embedded_models = set(embedded_models)
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def cost(self, model: str, prompt_tokens: int | None, completion_tokens: int | None) -> tuple[float | None, str]:
        if model in self.embedded_models:
            return 0.0, EMBEDDED
        pt, ct = prompt_tokens or 0, completion_tokens or 0
        ov = self.pricing.overrides.get(model)
        if ov is not None:
            return (pt * ov.input_per_mtok + ct * ov.output_per_mtok) / 1e6, OVERRIDE
        per_mtok = _database_price(model, self.pricing.provider_id or None)
        if per_mtok is None:
            with self._lock:
                if model not in self._warned:
                    self._warned.add(model)
                    log.warning(
                        "no price known for model %r: its cost is left empty in the ledger; "
                        "add [pricing.overrides.%r] to the config to price it", model, model,
                    )
            return None, UNKNOWN
        inp, out = per_mtok
        return (pt * inp + ct * out) / 1e6, DATABASE


def has_price(pricing: PricingSettings, model: str) -> bool:
    """Whether a call to `model` gets a cost: a config override or the genai-prices database knows it."""
    return model in pricing.overrides or _database_price(model, pricing.provider_id or None) is not None


@lru_cache(maxsize=256)
def _database_price(model: str, provider_id: str | None) -> tuple[float, float] | None:
    """USD per million (input, output) tokens from genai-prices, or None."""
    try:
        from genai_prices import Usage, calc_price
    except ImportError:  # pragma: no cover - dependency of the package
        return None
    try:
        one_in = calc_price(Usage(input_tokens=1_000_000, output_tokens=0), model, provider_id=provider_id)
        one_out = calc_price(Usage(input_tokens=0, output_tokens=1_000_000), model, provider_id=provider_id)
    except (LookupError, ValueError):
        return None
    return float(one_in.total_price), float(one_out.total_price)
