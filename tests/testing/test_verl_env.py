"""evolforge.testing.verl_env's failure modes (fast, no download): an unreachable package index is reported as
offline (the verl tests skip), anything else as a real error, and a failed build leaves nothing behind."""

from __future__ import annotations

import pytest

from evolforge.testing import verl_env
from evolforge.testing.verl_env import VerlEnvUnavailable, ensure_verl_env


def _build(tmp_path, monkeypatch, index_url: str, requirement: str) -> VerlEnvUnavailable:
    monkeypatch.setenv("EVOLFORGE_VERL_ENV", str(tmp_path / "env"))
    monkeypatch.setenv("PIP_INDEX_URL", index_url)
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    with pytest.raises(VerlEnvUnavailable) as err:
        ensure_verl_env((requirement,), timeout=120)
    # nothing half-built is left where the next call would look
    assert not (tmp_path / "env").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name != "env.lock"] == []
    return err.value


def test_unreachable_index_is_offline(tmp_path, monkeypatch):
    err = _build(tmp_path, monkeypatch, "http://127.0.0.1:9/simple", f"verl=={verl_env.VERL_VERSION}")
    assert err.offline and "Connection refused" in str(err)


def test_a_missing_package_is_a_real_error(tmp_path, monkeypatch):
    index = tmp_path / "index"
    index.mkdir()
    err = _build(tmp_path / "b", monkeypatch, index.as_uri(), "no-such-package-evolforge==1.0")
    assert not err.offline and "no-such-package-evolforge" in str(err)
