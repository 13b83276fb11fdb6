"""Typed settings and the default config files (default.toml, sample_seeds.jsonl)."""

from evolforge.config.settings import DEFAULT_CONFIG, SAMPLE_SEEDS, ConfigError, Settings, load_settings

__all__ = ["DEFAULT_CONFIG", "SAMPLE_SEEDS", "ConfigError", "Settings", "load_settings"]
