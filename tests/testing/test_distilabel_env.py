"""evolforge.testing.distilabel_env's failure modes (fast, no download): an unreachable package index is reported
as offline, anything else as a real error, and a failed build leaves no folder where the next call would look
(bench/bench_distilabel.py builds the environment for real)."""

from __future__ import annotations

import pytest

from evolforge.testing import distilabel_env
from evolforge.testing.distilabel_env import DistilabelEnvUnavailable, ensure_distilabel_env


def _build(tmp_path, monkeypatch, index_url: str, requirement: str) -> DistilabelEnvUnavailable:
    monkeypatch.setenv("EVOLFORGE_DISTILABEL_ENV", str(tmp_path / "env"))
    monkeypatch.setenv("PIP_INDEX_URL", index_url)
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    with pytest.raises(DistilabelEnvUnavailable) as err:
        ensure_distilabel_env((requirement,), timeout=120)
    assert not (tmp_path / "env").exists()
    return err.value


def test_unreachable_index_is_offline(tmp_path, monkeypatch):
    err = _build(tmp_path, monkeypatch, "http://127.0.0.1:9/simple",
                 f"distilabel=={distilabel_env.DISTILABEL_VERSION}")
    assert err.offline and "Connection refused" in str(err)


def test_a_missing_package_is_a_real_error(tmp_path, monkeypatch):
    index = tmp_path / "index"
    index.mkdir()
    err = _build(tmp_path / "b", monkeypatch, index.as_uri(), "no-such-package-evolforge==1.0")
    assert not err.offline and "no-such-package-evolforge" in str(err)
