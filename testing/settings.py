"""Settings for tests: the defaults, no EVOLFORGE__ environment, and the given section overrides."""

from __future__ import annotations


def make_settings(base_url: str = "", **sections):
    """`make_settings(url, evol_instruct={"rounds": 1})`: an empty url means the embedded model."""
    from evolforge.config.settings import load_settings

    overrides = dict(sections)
    if base_url:
        overrides.setdefault("gateway", {})["base_url"] = base_url
    return load_settings(None, overrides, environ={})
