"""`evolforge retry --out DIR` takes no security setting from the folder: the endpoint the key goes to, the
plain-http guard and the dedup index come from the user's config, environment and flags. Where the folder's
record differs, the command stops (one line naming both, exit 2) before any request or write, unless the user
names the value with a flag."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from evolforge.config.settings import load_settings
from evolforge.testing.net import SERVE_POLL

SCRIPT = Path(sys.executable).with_name("evolforge")
KEY = "sk-operator-key-0123456789abcdef"


def evolforge(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "evolforge.cli"]
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith("EVOLFORGE") and k not in ("OPENAI_API_KEY", "PREFECT_API_URL")}
    full_env.update(env or {})
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=120, env=full_env)


@pytest.fixture
def collector():
    """An endpoint that records what reaches it (the attacker's, named by a planted run.json)."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def _any(self):
            seen.append({"path": self.path, "authorization": self.headers.get("Authorization")})
            body = json.dumps({"object": "list", "data": [{"id": "m"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _any

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": SERVE_POLL}, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1", seen
    srv.shutdown()


def plant_run(out: Path, seeds: Path, **gateway) -> Path:
    """A run folder whose run.json names its own gateway settings (what an attacker who can write the folder
    plants)."""
    settings = load_settings(overrides={"gateway": gateway}, environ={}).fingerprint()
    out.mkdir(parents=True)
    (out / "run.json").write_text(json.dumps({"run_id": "planted", "created_at": "2024-01-01", "seeds": str(seeds),
                                              "settings": settings, "history": []}))
    return out


@pytest.fixture
def seeds(tmp_path) -> Path:
    p = tmp_path / "seeds.jsonl"
    p.write_text('{"id": "s0", "instruction": "Explain tides to a child."}\n')
    return p


def _one_line_error(proc) -> str:
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert "Traceback" not in text and proc.stderr.startswith("evolforge"), text
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    return proc.stderr


def test_the_folder_does_not_choose_where_the_key_goes(tmp_path, seeds, collector):
    url, seen = collector
    out = plant_run(tmp_path / "run", seeds, base_url=url)
    proc = evolforge("retry", "--out", str(out), env={"OPENAI_API_KEY": KEY})
    err = _one_line_error(proc)
    assert url in err and "embedded model" in err and "--base-url" in err  # both named, and the way on
    assert seen == []  # nothing, let alone the key, went to the folder's endpoint
    assert KEY not in err


def test_the_users_endpoint_that_differs_from_the_folders_is_named_too(tmp_path, seeds, collector):
    url, seen = collector
    out = plant_run(tmp_path / "run", seeds, base_url=url)
    mine = "http://127.0.0.1:9/v1"
    proc = evolforge("retry", "--out", str(out), env={"OPENAI_API_KEY": KEY, "EVOLFORGE__GATEWAY__BASE_URL": mine})
    err = _one_line_error(proc)
    assert url in err and mine in err and seen == []


def test_the_folder_does_not_switch_the_plain_http_guard_off(tmp_path, seeds):
    remote_http = "http://192.0.2.1:9/v1"  # TEST-NET-1: not loopback, never answers
    out = plant_run(tmp_path / "run", seeds, base_url=remote_http, allow_key_over_http=True)
    # the user names the endpoint (so it is not a disagreement), but never allowed a key over plain http
    proc = evolforge("retry", "--out", str(out), "--base-url", remote_http, env={"OPENAI_API_KEY": KEY})
    err = _one_line_error(proc)
    assert "refusing to send the API key over plain http" in err and "allow_key_over_http" in err
    assert KEY not in err
