"""`evolforge proxy` with proxy.workers = 2: two worker processes on one port, as a user runs it. Every call is one
record and one ledger row whichever worker took it; the session tree is one tree across the workers (a parent
claimed on one worker is enforced on the other); SIGTERM stops both with everything written."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter

import httpx

from evolforge.storage.ledger import read_ledger
from evolforge.storage.proxy_sets import ProxyLayout, iter_records
from evolforge.testing.agent_upstream import AgentUpstream
from evolforge.testing.net import free_port, wait_up

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _post(url: str, path: str, parent: str | None = None, body: dict | None = None) -> httpx.Response:
    """One call on a connection of its own (so the two workers share the calls)."""
    headers = {"X-Evolforge-Parent-Session": parent} if parent else {}
    with httpx.Client(base_url=url, timeout=30) as c:
        return c.post(path, json=body or BODY, headers=headers)


def test_two_workers_one_record_and_row_per_call_and_one_session_tree(tmp_path):
    out = tmp_path / "rec"
    cfg = tmp_path / "workers.toml"
    cfg.write_text("[proxy]\nworkers = 2\n")
    port = free_port()
    with AgentUpstream() as up:
        proc = subprocess.Popen([sys.executable, "-m", "evolforge.cli", "proxy", "--config", str(cfg), "--upstream",
                                 up.base_url, "--port", str(port), "--out", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_up(f"{url}/healthz", timeout=120)
            statuses = Counter()
            assert _post(url, "/s/child/v1/chat/completions", parent="root").status_code == 200
            for i in range(40):
                statuses[_post(url, f"/s/plain-{i}/v1/chat/completions").status_code] += 1
                # the parent was claimed once, on some worker: a different parent is refused on both
                r = _post(url, "/s/child/v1/chat/completions", parent="other")
                assert r.status_code == 409 and "already belongs to parent 'root'" in r.json()["error"]["message"]
                # a loop is refused on both: root would descend from its own child
                assert _post(url, "/s/root/v1/chat/completions", parent="child").status_code == 409
                statuses[_post(url, "/s/child/v1/chat/completions", parent="root" if i % 2 else None).status_code] += 1
            assert statuses == Counter({200: 80})
            streamed = _post(url, "/s/child/v1/chat/completions", body={**BODY, "stream": True})
            assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
        finally:
            proc.send_signal(signal.SIGTERM)
            log, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, log
    assert "Traceback" not in log, log
    layout = ProxyLayout(out)
    recs = list(iter_records(layout))
    calls = 1 + 40 * 4 + 1
    assert len(recs) == calls
    assert len(read_ledger(layout.root)) == calls
    assert len({r["record_id"] for r in recs}) == calls
    per_file = [sum(1 for _ in open(f)) for f in layout.records_dir.glob("*.jsonl")]
    assert len([n for n in per_file if n]) == 2, per_file  # both workers took calls
    ok = [r for r in recs if r["status"] == 200]
    assert len(ok) == 82 and sum(1 for r in recs if r["status"] == 409) == 80
    assert {r["parent_session"] for r in ok if r["session"] == "child"} <= {"root", None}
    assert len(up.received) == 82  # refused calls never reached the upstream
    assert json.loads(layout.info.read_text())["workers"] == 2


def test_workers_refuse_what_they_cannot_share(tmp_path):
    cfg = tmp_path / "workers.toml"
    cfg.write_text('[proxy]\nworkers = 2\ntranslate = "responses"\n')
    r = subprocess.run([sys.executable, "-m", "evolforge.cli", "proxy", "--config", str(cfg), "--upstream",
                        "http://127.0.0.1:9/v1", "--port", str(free_port()), "--out", str(tmp_path / "rec")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "previous_response_id" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "rec" / "records").exists()  # refused before anything was made
