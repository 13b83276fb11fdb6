"""Cost in USD of one model call.

Order: the embedded model is free (and the ledger says so); then an override
from `[pricing.overrides."MODEL"]` in config; then the genai-prices database.
A model found in neither has cost None (null in the ledger) and one warning per
model name: unknown never becomes a silent 0.

Each call is priced from its own counts (`PriceBook.cost`): prompt tokens (all of them, cached or not), completion
tokens, and among the prompt tokens the cache reads and cache writes (`cache_tokens` reads them from any API's
usage: Anthropic's cache_read_input_tokens / cache_creation_input_tokens, OpenAI's
prompt_tokens_details.cached_tokens or the Responses API's input_tokens_details.cached_tokens). genai-prices'
rates apply as genai-prices applies them: cache reads and writes at their own rate (the input rate when the
database has none), and a tiered model (long context) at the tier the call's own prompt size selects, every
token of the call at that tier. A config override has one input rate: cached tokens pay it too.
"""

from __future__ import annotations

import logging
import threading
from decimal import Decimal
from functools import lru_cache
from typing import Any

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

    def cost(self, model: str, prompt_tokens: int | None, completion_tokens: int | None,
             cache_read_tokens: int | None = 0, cache_write_tokens: int | None = 0) -> tuple[float | None, str]:
        """(USD, where the price came from) of one call. `prompt_tokens` counts every prompt token; the cache
        reads and writes are among them (clamped to them: a usage that claims more cached than prompt tokens
        prices the rest at nothing)."""
        if model in self.embedded_models:
            return 0.0, EMBEDDED
        pt, ct = prompt_tokens or 0, completion_tokens or 0
        ov = self.pricing.overrides.get(model)
        if ov is not None:
            return (pt * ov.input_per_mtok + ct * ov.output_per_mtok) / 1e6, OVERRIDE
        rates = _database_rates(model, self.pricing.provider_id or None)
        if rates is None:
            with self._lock:
                if model not in self._warned:
                    self._warned.add(model)
                    log.warning(
                        "no price known for model %r: its cost is left empty in the ledger; "
                        "add [pricing.overrides.%r] to the config to price it", model, model,
                    )
            return None, UNKNOWN
        read = min(cache_read_tokens or 0, pt)
        write = min(cache_write_tokens or 0, pt - read)
        return _price(rates, pt, ct, read, write), DATABASE


def cache_tokens(usage: Any) -> tuple[int, int]:
    """(cache reads, cache writes) among a call's prompt tokens, from whichever API's usage fields it carries
    (0 where it says nothing or says it in a shape that is not a count)."""
    if not isinstance(usage, dict):
        return 0, 0

    def count(value: Any) -> int:
        return value if type(value) is int and value >= 0 else 0

    if "cache_read_tokens" in usage or "cache_write_tokens" in usage:  # the proxy's ledger usage
        return count(usage.get("cache_read_tokens")), count(usage.get("cache_write_tokens"))
    if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:  # Anthropic's Messages API
        return count(usage.get("cache_read_input_tokens")), count(usage.get("cache_creation_input_tokens"))
    for key in ("prompt_tokens_details", "input_tokens_details"):  # OpenAI's chat / Responses API
        details = usage.get(key)
        if isinstance(details, dict):
            return count(details.get("cached_tokens")), 0
    return 0, 0


def has_price(pricing: PricingSettings, model: str) -> bool:
    """Whether a call to `model` gets a cost: a config override or the genai-prices database knows it."""
    return model in pricing.overrides or _database_rates(model, pricing.provider_id or None) is not None


RATE_KEYS = ("input_mtok", "output_mtok", "cache_read_mtok", "cache_write_mtok")


@lru_cache(maxsize=256)
def _database_rates(model: str, provider_id: str | None) -> dict[str, Any] | None:
    """The model's genai-prices rates per million tokens (a Decimal, or genai-prices' TieredPrices for a
    long-context model): input, output, cache read and cache write; None for a model the database lacks.
    Looked up once per model: pricing a call is then arithmetic, no database search on the proxy's hot path."""
    try:
        from genai_prices import Usage, calc_price
    except ImportError:  # pragma: no cover - dependency of the package
        return None
    try:
        found = calc_price(Usage(input_tokens=0, output_tokens=0), model, provider_id=provider_id)
    except (LookupError, ValueError):
        return None
    prices = found.model_price
    rates = {k: getattr(prices, k, None) for k in RATE_KEYS}
    if rates["input_mtok"] is None and rates["output_mtok"] is None:
        return None
    rates["input_mtok"] = rates["input_mtok"] or Decimal(0)
    rates["output_mtok"] = rates["output_mtok"] or Decimal(0)
    return rates


def _rate(price: Any, prompt_tokens: int) -> Decimal:
    """A rate at the tier the call's prompt size selects (genai-prices' rule: the highest tier whose start the
    prompt passes applies to every token)."""
    tiers = getattr(price, "tiers", None)
    if tiers is None:
        return price
    rate = price.base
    for tier in sorted(tiers, key=lambda t: t.start):
        if prompt_tokens > tier.start:
            rate = tier.price
    return rate


def _price(rates: dict[str, Any], pt: int, ct: int, read: int, write: int) -> float:
    inp = _rate(rates["input_mtok"], pt)
    read_rate = _rate(rates["cache_read_mtok"], pt) if rates["cache_read_mtok"] is not None else inp
    write_rate = _rate(rates["cache_write_mtok"], pt) if rates["cache_write_mtok"] is not None else inp
    total = ((pt - read - write) * inp + read * read_rate + write * write_rate
             + ct * _rate(rates["output_mtok"], pt))
    return float(total / 1_000_000)
