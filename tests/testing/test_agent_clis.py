"""testing/agent_clis.py finds the agent CLIs in the npm cache folder or on PATH, and says where it looked when
it finds neither (the reason the slow CLI tests give when they skip)."""

from __future__ import annotations

import os

from evolforge.testing import agent_clis


def _fake_cli(folder, name: str, code: int = 0):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\necho '{name} 0.0-test'\nexit {code}\n")
    path.chmod(0o755)
    return path


def test_a_cli_on_path_is_found_when_the_cache_folder_lacks_it(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOLFORGE_NPM_CACHE", str(tmp_path / "empty-cache"))
    fake = _fake_cli(tmp_path / "bin", "codex")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert agent_clis.binary("codex") == fake
    assert agent_clis.missing("codex") is None


def test_the_cache_folder_comes_first(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cached = _fake_cli(cache / "node_modules" / ".bin", "claude")
    _fake_cli(tmp_path / "bin", "claude")
    monkeypatch.setenv("EVOLFORGE_NPM_CACHE", str(cache))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert agent_clis.binary("claude") == cached


def test_the_skip_reason_names_both_places_and_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOLFORGE_NPM_CACHE", str(tmp_path / "empty-cache"))
    node = _fake_cli(tmp_path / "node-only", "node").parent  # node present, no CLI anywhere
    monkeypatch.setenv("PATH", str(node))
    why = agent_clis.missing("claude")
    assert why is not None and str(tmp_path / "empty-cache") in why and "nor on PATH" in why
    assert "npm install --prefix" in why and "@anthropic-ai/claude-code" in why
    _fake_cli(tmp_path / "broken", "claude", code=3)
    monkeypatch.setenv("PATH", f"{tmp_path / 'broken'}{os.pathsep}{node}")
    assert "--version` fails" in agent_clis.missing("claude")
