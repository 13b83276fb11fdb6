"""Typed settings: TOML + env overrides; invalid config fails at start naming the key."""

from __future__ import annotations

import pytest

from evolforge.config.settings import ConfigError, load_settings


def test_defaults_load_and_follow_rleif_names():
    s = load_settings(environ={})
    e = s.evol_instruct
    assert (e.rounds, e.evolve_up_ratio, e.evolve_down_ratio, e.temperature, e.top_p) == (4, 0.7, 0.3, 0.9, 0.95)
    assert s.uses_embedded_model
    assert s.models.for_stage("judge") == s.models.default


def test_env_overrides_win_over_file(tmp_path):
    s = load_settings(environ={"EVOLFORGE__EVOL_INSTRUCT__ROUNDS": "6", "EVOLFORGE__MODELS__JUDGE": "gpt-4o-mini",
                               "EVOLFORGE__GATEWAY__BASE_URL": "http://gpu:8000/v1"})
    assert s.evol_instruct.rounds == 6 and s.models.for_stage("judge") == "gpt-4o-mini"
    assert s.models.for_stage("evolve") == s.models.default and not s.uses_embedded_model


def test_explicit_overrides_win_over_env():
    s = load_settings(overrides={"evol_instruct": {"rounds": 2}}, environ={"EVOLFORGE__EVOL_INSTRUCT__ROUNDS": "6"})
    assert s.evol_instruct.rounds == 2


@pytest.mark.parametrize("toml,key,problem", [
    ("[evol_instruct]\nrounds = 0\n", "evol_instruct.rounds", "greater than or equal to 1"),
    ("[evol_instruct]\ntemperatur = 0.5\n", "evol_instruct.temperatur", "unknown key"),
    ("[evol_instruct]\nevolve_up_ratio = 0.9\nevolve_down_ratio = 0.3\n", "evol_instruct", "must be 1.0"),
    ("[gateway]\nconcurrency = \"many\"\n", "gateway.concurrency", "valid integer"),
    ("[embedded]\nhost = \"0.0.0.0\"\n", "embedded.host", "loopback"),
])
def test_invalid_config_names_key_and_problem(tmp_path, toml, key, problem):
    p = tmp_path / "bad.toml"
    p.write_text(toml)
    with pytest.raises(ConfigError) as ei:
        load_settings(p, environ={})
    msg = str(ei.value)
    assert key in msg and problem in msg and str(p) in msg


def test_invalid_env_override_is_reported():
    with pytest.raises(ConfigError) as ei:
        load_settings(environ={"EVOLFORGE__EVOL_INSTRUCT__TOP_P": "7"})
    assert "evol_instruct.top_p" in str(ei.value)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "nope.toml")
    bad = tmp_path / "x.toml"
    bad.write_text("[gateway\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(bad)
