"""The recording proxy's trust boundaries (issue 24), each driven by a real client against the real proxy on loopback:
no URL credential is shown or written, every call ends as one record and one ledger row whatever the client or the
upstream sends, a web page cannot drive it, the key never goes over plain http to a remote host, session events are
capped, and a session name is matched in full."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from evolforge.storage.ledger import read_ledger
from evolforge.storage.proxy_sets import ProxyLayout, iter_events, iter_records
from evolforge.tasks.core.keys import InsecureKeyTransport
from evolforge.tasks.proxy.server import running_proxy
from evolforge.tasks.proxy.upstream import ProxyConfigError
from evolforge.testing.agent_upstream import AgentUpstream
from evolforge.testing.hostile_upstream import REPLIES, STREAMS, HostileUpstream
from evolforge.testing.lazy import lazy_module
from evolforge.testing.proxy_records import wait_for_records
from evolforge.testing.settings import make_settings

openai = lazy_module("openai")

URL_SECRET = "pw-in-the-URL-0123456789"
ENV_KEY = "sk-env-SECRET-0123456789"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _records(layout: ProxyLayout, n: int, timeout: float = 5.0) -> list[dict]:
    return wait_for_records(layout, n, timeout, poll=0.02, by_time=False)


def _no_keys(monkeypatch):
    for name in ("EVOLFORGE_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "EVOLFORGE_PROXY_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def _header(received: dict, name: str) -> str | None:
    return next((v for k, v in received["headers"].items() if k.lower() == name), None)


def _with_userinfo(url: str, secret: str = URL_SECRET) -> str:
    return url.replace("http://", f"http://agent:{secret}@", 1)


@pytest.fixture
def hostile():
    with HostileUpstream() as up:
        yield up


@pytest.fixture
def hproxy(hostile, tmp_path, monkeypatch):
    _no_keys(monkeypatch)
    with running_proxy(make_settings(), hostile.base_url, str(tmp_path / "rec")) as url:
        yield url, ProxyLayout(tmp_path / "rec")


# 1. credentials in the upstream URL are never shown or written


def test_url_credentials_reach_no_health_answer_file_or_message(tmp_path, monkeypatch):
    _no_keys(monkeypatch)
    with AgentUpstream() as up:
        upstream = _with_userinfo(up.base_url)
        with running_proxy(make_settings(), upstream, str(tmp_path / "rec")) as url:
            health = httpx.get(f"{url}/healthz")
            assert health.status_code == 200 and URL_SECRET not in health.text
            assert health.json()["upstream"] == up.base_url.replace("http://", "http://***@")
            r = openai.OpenAI(base_url=f"{url}/s/u/v1", api_key="none").chat.completions.create(**CHAT)
            assert r.choices[0].message.content == "Echo: hi"
        assert _header(up.received[-1], "authorization") == "Basic " + base64.b64encode(f"agent:{URL_SECRET}".encode()).decode()  # still used, as Basic auth
    down = _with_userinfo("http://127.0.0.1:9/v1")
    with running_proxy(make_settings(), down, str(tmp_path / "rec")) as url:
        r = httpx.post(f"{url}/s/u/v1/chat/completions", json=CHAT)
        assert r.status_code == 502 and URL_SECRET not in r.text
    check = subprocess.run([sys.executable, "-m", "evolforge.cli", "proxy", "--check", "--upstream", down,
                            "--out", str(tmp_path / "rec")], capture_output=True, text=True, timeout=120)
    assert check.returncode == 1 and "502" in check.stderr
    assert URL_SECRET not in check.stdout + check.stderr
    files = [p for p in (tmp_path / "rec").rglob("*") if p.is_file()]
    assert any(p.name == "proxy.json" for p in files) and len(_records(ProxyLayout(tmp_path / "rec"), 3)) >= 3
    for p in files:
        assert URL_SECRET.encode() not in p.read_bytes(), p


def test_health_shows_nothing_but_ok_without_the_token(tmp_path, monkeypatch):
    _no_keys(monkeypatch)
    monkeypatch.setenv("EVOLFORGE_PROXY_TOKEN", "tok-123")
    with AgentUpstream() as up, running_proxy(make_settings(), up.base_url, str(tmp_path / "rec")) as url:
        assert httpx.get(f"{url}/healthz").json() == {"ok": True}
        shown = httpx.get(f"{url}/healthz", headers={"X-Evolforge-Proxy-Token": "tok-123"}).json()
        assert shown["upstream"] == up.base_url and shown["calls"] == 0


def test_url_credentials_and_an_environment_key_cannot_both_be_the_authorization(tmp_path, monkeypatch):
    _no_keys(monkeypatch)
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    with pytest.raises(ProxyConfigError, match="credentials") as e:
        with running_proxy(make_settings(), _with_userinfo("http://127.0.0.1:9/v1"), str(tmp_path / "rec")):
            pass
    assert URL_SECRET not in str(e.value)


# 2. every call ends as exactly one record and one ledger row


@pytest.mark.parametrize("model", [["a", "b"], {"name": "m"}, 7, None, True, "\ud800", "m" * 100_000])
def test_a_request_whose_model_is_not_a_name_is_recorded_and_in_the_ledger(tmp_path, monkeypatch, model):
    _no_keys(monkeypatch)
    body = json.dumps({**CHAT, "model": model}).encode()  # ASCII escapes: a lone surrogate goes as \\ud800
    with AgentUpstream() as up, running_proxy(make_settings(), up.base_url, str(tmp_path / "rec")) as url:
        r = httpx.post(f"{url}/s/odd/v1/chat/completions", content=body, headers={"content-type": "application/json"},
                       timeout=10)
        assert r.status_code == 200 and r.json()["model"] == model  # the upstream echoes the model it was sent
        (rec,) = _records(ProxyLayout(tmp_path / "rec"), 1)
    assert rec["session"] == "odd" and rec["status"] == 200 and rec["request"]["parameters"]["model"] == model
    name = model if isinstance(model, str) and len(model) <= 256 else None  # a name, or none at all
    assert rec["model"] == name
    led = read_ledger(tmp_path / "rec")
    assert led.height == 1 and led["task_id"][0] == "odd"
    assert led["model"][0] == (name.encode("utf-8", "replace").decode() if name else None)


BAD_SHAPES = sorted(set(REPLIES) - {"ok", "status_201", "error_str", "error_list", "error_junk", "error_nested"})
# what still parses into the OpenAI form: the odd optional fields are dropped from the record, the answer passes
PASSING = {"model_list", "model_dict", "model_int", "id_dict", "finish_reason_dict", "logprobs_list", "token_ids_str",
           "prompt_token_ids_dict", "reasoning_list", "big_int", "lone_surrogate", "surrogate_model"}


@pytest.mark.parametrize("shape", BAD_SHAPES)
def test_an_upstream_reply_of_unexpected_shape_is_a_502_and_a_failed_record(hproxy, shape):
    url, layout = hproxy
    r = httpx.post(f"{url}/s/shape/v1/chat/completions", json=CHAT, headers={"X-Hostile-Reply": shape}, timeout=10)
    if shape in PASSING:
        assert r.status_code == 200 and r.content == REPLIES[shape][2]
    else:
        assert r.status_code == 502 and r.json()["error"]["type"] == "upstream_invalid_response"
    (rec,) = _records(layout, 1)
    led = read_ledger(layout.root)
    assert led.height == 1 and led["outcome"][0] == ("ok" if shape in PASSING else "malformed_response")
    assert (rec["error"] is None) == (shape in PASSING)
    resp = rec["response"] or {}
    if shape in PASSING:
        assert resp["content"] in ("ok", "\ud800 x") and resp["token_ids"] is None
        assert all(isinstance(resp[k], (str, type(None))) for k in ("model", "id", "finish_reason", "reasoning_content"))
        assert resp["logprobs"] is None or isinstance(resp["logprobs"], dict)


@pytest.mark.parametrize("shape", ["error_str", "error_list", "error_junk", "error_nested", "status_201"])
def test_an_upstream_error_of_any_shape_passes_through_and_is_recorded(hproxy, shape):
    url, layout = hproxy
    r = httpx.post(f"{url}/s/err/v1/chat/completions", json=CHAT, headers={"X-Hostile-Reply": shape}, timeout=10)
    status, _, body = REPLIES[shape]
    assert r.status_code == status and r.content == body
    (rec,) = _records(layout, 1)
    assert rec["status"] == status and read_ledger(layout.root).height == 1
    assert (rec["error"] is None) == (status == 200) and isinstance(rec["error"], (str, type(None)))


# streams whose odd optional fields are dropped from the record; every other anomaly marks the record failed
STREAMS_PASSING = {"s_ok", "s_crlf", "s_surrogate", "s_model_dict", "s_id_list", "s_finish_reason_list",
                   "s_logprobs_str", "s_token_ids_str", "s_prompt_token_ids_dict", "s_reasoning_int"}


@pytest.mark.parametrize("shape", sorted(STREAMS))
def test_a_stream_of_unexpected_shape_reaches_the_client_whole_and_is_recorded(hproxy, shape):
    url, layout = hproxy
    with httpx.Client(timeout=10) as c, c.stream("POST", f"{url}/s/st/v1/chat/completions", json={**CHAT, "stream": True},
                                                 headers={"X-Hostile-Reply": shape}) as r:
        assert r.status_code == 200
        got = b"".join(r.iter_raw())
    sent = b"".join(STREAMS[shape])
    if shape == "s_cut":  # what came, then an error event the client's SDK raises (not a silent end)
        assert got.startswith(b"".join(STREAMS[shape][:-1])) and b'"type":"upstream_error"' in got
    else:
        assert got == sent  # byte for byte, as the upstream sent it
    (rec,) = _records(layout, 1)
    led = read_ledger(layout.root)
    assert rec["stream"] and rec["status"] == 200 and led.height == 1
    fine = shape in STREAMS_PASSING
    assert (rec["error"] is None) == fine, rec["error"]
    assert (led["outcome"][0] == "ok") == fine
    resp = rec["response"]
    assert isinstance(resp["content"], (str, type(None))) and isinstance(resp["tool_calls"], (list, type(None)))
    for call in resp["tool_calls"] or []:
        assert isinstance(call["function"]["name"], str) and isinstance(call["function"]["arguments"], str)
    assert resp["usage"] is None or all(isinstance(v, int) for v in resp["usage"].values() if v is not None)


@pytest.mark.parametrize("body", [
    b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',  # a lone surrogate
    b'{"model": "m", "messages": ' + b"[" * 20_000 + b"]" * 20_000 + b"}",  # past any parser's depth
    b'{"model": "m", "messages": [], "n": ' + b"9" * 400 + b"}",  # an int of 400 digits
    b'{"model": "m", "messages": [], "temperature": NaN}',
    b'{"model": "m", "stream": "yes", "messages": []}',
    b'{"model": "m", "stream": true, "messages": {"role": "user"}}',
    b'{"model": {"$ne": 1}, "messages": "hi", "tools": "none", "tool_choice": 5}',
    b"[1, 2, 3]",
    b"\xff\xfe\x00",
])
def test_a_hostile_request_body_gets_an_answer_and_is_recorded(hproxy, body):
    url, layout = hproxy
    r = httpx.post(f"{url}/s/req/v1/chat/completions", content=body, headers={"content-type": "application/json"},
                   timeout=10)
    assert r.status_code in (200, 400)
    if r.status_code == 400:
        assert r.json()["error"]["type"] == "invalid_json"
    assert len(_records(layout, 1)) == 1 and read_ledger(layout.root).height == 1


def test_refused_calls_cost_nothing_in_the_ledger(hproxy):
    url, layout = hproxy
    httpx.post(f"{url}/s/a/v1/chat/completions", content=b"{bad", headers={"content-type": "application/json"})
    httpx.post(f"{url}/s/a/v1/chat/completions", json=CHAT)
    _records(layout, 2)  # written after the answer has gone out
    led = read_ledger(layout.root).sort("outcome")
    assert led["outcome"].to_list() == ["http_400", "ok"]
    assert led["cost_usd"][0] == 0.0 and led["price_source"][0] == "not forwarded"


# 3. a web page (or DNS rebinding) cannot drive the proxy


def test_a_cross_origin_text_plain_post_from_a_web_page_is_refused(hproxy, hostile):
    url, layout = hproxy
    port = url.rsplit(":", 1)[1]
    page = {"Host": f"rebind.attacker.example:{port}", "Origin": "http://rebind.attacker.example",
            "Content-Type": "text/plain", "Sec-Fetch-Site": "cross-site"}
    body = json.dumps(CHAT)
    cases = [(page, 403, "forbidden_host"),
             ({"Host": f"rebind.attacker.example:{port}"}, 403, "forbidden_host"),
             ({"Origin": "http://rebind.attacker.example"}, 403, "forbidden_origin"),
             ({"Origin": "null"}, 403, "forbidden_origin"),
             ({"Sec-Fetch-Site": "cross-site"}, 403, "forbidden_origin"),
             ({"Content-Type": "text/plain"}, 415, "unsupported_media_type"),
             ({"Content-Type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"),
             ({"Content-Type": "multipart/form-data; boundary=x"}, 415, "unsupported_media_type")]
    with httpx.Client(base_url=url, timeout=10) as c:
        for headers, status, kind in cases:
            r = c.post("/s/victim/v1/chat/completions", content=body, headers={"Content-Type": "application/json", **headers})
            assert (r.status_code, r.json()["error"]["type"]) == (status, kind), headers
        assert c.get("/healthz", headers={"Host": "rebind.attacker.example"}).status_code == 403
        assert c.get("/v1/models", headers={"Host": "rebind.attacker.example"}).status_code == 403
        r = c.post("/s/victim/reward", json={"reward": 1}, headers={"Origin": "http://rebind.attacker.example"})
        assert r.status_code == 403
        r = c.post("/s/victim/reward", content=b'{"reward": 1}', headers={"Content-Type": "text/plain"})
        assert r.status_code == 415
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost", f"[::1]:{port}"):
            assert c.post("/s/ok/v1/chat/completions", json=CHAT, headers={"Host": host}).status_code == 200, host
        assert c.post("/s/ok/v1/chat/completions", json=CHAT, headers={"Sec-Fetch-Site": "same-origin"}).status_code == 200
    assert not any(r["path"].endswith("/chat/completions") and b"victim" in r["body"] for r in hostile.received)
    assert len(hostile.received) == 5  # only the five calls from this machine's names reached the upstream
    recs = _records(layout, len(cases) + 6)  # the refused calls too (GET /v1/models included), not /healthz
    assert sorted((r["session"], r["status"]) for r in recs if r["status"] != 200) == \
        [("(refused)", 403)] * 6 + [("victim", 415)] * 3  # refused at the door: under a session no client can name
    assert read_ledger(layout.root).height == len(recs) == len(cases) + 6
    assert list(iter_events(layout)) == []


def test_allowed_origins_and_hosts_let_a_configured_page_in(hostile, tmp_path, monkeypatch):
    _no_keys(monkeypatch)
    settings = make_settings(proxy={"allowed_origins": ["http://localhost:3000"], "allowed_hosts": ["proxy.lan"]})
    with running_proxy(settings, hostile.base_url, str(tmp_path / "rec")) as url, httpx.Client(base_url=url) as c:
        page = {"Origin": "http://localhost:3000", "Sec-Fetch-Site": "cross-site"}
        pre = c.options("/s/ui/v1/chat/completions", headers={**page, "Access-Control-Request-Method": "POST",
                                                              "Access-Control-Request-Headers": "content-type"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://localhost:3000"
        r = c.post("/s/ui/v1/chat/completions", json=CHAT, headers=page)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert c.post("/s/ui/v1/chat/completions", json=CHAT, headers={"Origin": "http://evil.example"}).status_code == 403
        assert c.post("/s/ui/v1/chat/completions", json=CHAT, headers={"Host": "proxy.lan:8787"}).status_code == 200
        assert c.post("/s/ui/v1/chat/completions", json=CHAT, headers={"Host": "other.lan"}).status_code == 403


# 4. key transport: the gateway's one check


def _lan_address() -> str | None:
    """An address of this machine that is not loopback (the upstream binds it), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.254", 9))  # no packet is sent: this only picks the outgoing interface
            addr = s.getsockname()[0]
        except OSError:
            return None
    return None if addr.startswith("127.") else addr


def test_the_environment_key_never_goes_over_plain_http_to_a_remote_upstream(tmp_path, monkeypatch):
    _no_keys(monkeypatch)
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    with pytest.raises(InsecureKeyTransport, match="allow_key_over_http"):
        with running_proxy(make_settings(), "http://10.255.0.1:8000/v1", str(tmp_path / "a")):
            pass
    assert not (tmp_path / "a" / "proxy.json").exists()
    with socket.socket() as busy:  # the settings error is reported as itself, even when the port is taken too
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        r = subprocess.run([sys.executable, "-m", "evolforge.cli", "proxy", "--upstream", "http://10.255.0.1:8000/v1",
                            "--port", str(busy.getsockname()[1]), "--out", str(tmp_path / "b")],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "allow_key_over_http" in r.stderr and ENV_KEY not in r.stderr
    ok = make_settings(gateway={"allow_key_over_http": True})
    with running_proxy(ok, "http://10.255.0.1:8000/v1", str(tmp_path / "c")):
        pass
    with running_proxy(make_settings(), "https://10.255.0.1/v1", str(tmp_path / "d")):
        pass


def test_a_clients_key_is_not_passed_over_plain_http_to_a_remote_upstream(tmp_path, monkeypatch):
    addr = _lan_address()
    if addr is None:
        pytest.skip("this machine has no address besides loopback")
    _no_keys(monkeypatch)
    with HostileUpstream(host=addr) as up, running_proxy(make_settings(), up.base_url, str(tmp_path / "rec")) as url:
        r = openai.OpenAI(base_url=f"{url}/s/c/v1", api_key="sk-client-SECRET-42").chat.completions.create(**CHAT)
        assert r.choices[0].message.content == "ok"
        assert _header(up.received[-1], "authorization") is None
    with HostileUpstream() as up, running_proxy(make_settings(), up.base_url, str(tmp_path / "rec2")) as url:
        openai.OpenAI(base_url=f"{url}/s/c/v1", api_key="sk-client-SECRET-42").chat.completions.create(**CHAT)
        assert _header(up.received[-1], "authorization") == "Bearer sk-client-SECRET-42"  # loopback: passed


# 5. session events are capped


def test_reward_and_finish_bodies_are_capped(hproxy):
    url, layout = hproxy
    big = {"reward": 1.0, "details": "x" * 2_000_000}
    with httpx.Client(base_url=url, timeout=30) as c:
        for kind in ("reward", "finish"):
            r = c.post(f"/s/capped/{kind}", json=big)
            assert r.status_code == 413 and "max_event_bytes" in r.json()["error"]["message"], kind

            def chunks():  # no content-length: the cap holds while reading
                for _ in range(40):
                    yield b"x" * 65536

            r = c.post(f"/s/capped/{kind}", content=chunks(), headers={"content-type": "application/json"})
            assert r.status_code == 413, kind
        assert c.post("/s/capped/reward", json={"reward": 0.5}).status_code == 200
    assert [e["event"] for e in iter_events(layout)] == ["reward"]
    assert max(p.stat().st_size for p in Path(layout.events_dir).iterdir()) < 10_000


# 6. a session name is matched in full


def test_a_session_name_with_a_trailing_newline_is_refused(hproxy, hostile):
    url, layout = hproxy
    with httpx.Client(base_url=url, timeout=10) as c:
        r = c.post("/s/abc%0A/v1/chat/completions", json=CHAT)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_session"
        assert c.post("/s/abc%0A/reward", json={"reward": 1}).status_code == 400
        assert c.post("/s/abc%0A/finish").status_code == 400
        r = c.post("/s//v1/chat/completions", json=CHAT)  # an empty session in the path is no session at all
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_session"
    assert hostile.received == []
    recs = _records(layout, 2)
    assert len(recs) == 2 and {r["session"] for r in recs} == {"invalid"}
    assert list(iter_events(layout)) == []


def test_ctrl_c_stops_the_proxy_cleanly_with_every_record_written(hostile, tmp_path, monkeypatch):
    """Found by the fuzz benchmark: uvicorn re-raises Ctrl-C after its graceful stop, which printed a traceback."""
    import signal

    from evolforge.testing.net import free_port, wait_up

    _no_keys(monkeypatch)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "evolforge.cli", "proxy", "--upstream", hostile.base_url, "--port",
                             str(port), "--out", str(tmp_path / "rec")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_up(f"http://127.0.0.1:{port}/healthz")
        for _ in range(3):
            assert httpx.post(f"http://127.0.0.1:{port}/s/c/v1/chat/completions", json=CHAT).status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert len(list(iter_records(ProxyLayout(tmp_path / "rec")))) == 3 and read_ledger(tmp_path / "rec").height == 3



# 6. a key belongs to the upstream API it was configured for (issue 36)

ANTHROPIC_KEY = "sk-ant-OPERATOR-0123456789"
CLIENT_BEARER, CLIENT_X, CLIENT_AZURE = "sk-client-BEARER-1", "sk-client-XAPI-2", "sk-client-AZURE-3"
MESSAGES = {"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
CLIENT_HEADERS = {"Authorization": f"Bearer {CLIENT_BEARER}", "x-api-key": CLIENT_X, "api-key": CLIENT_AZURE,
                  "anthropic-version": "2023-06-01"}


def _credentials(received: dict) -> dict[str, str]:
    return {k.lower(): v for k, v in received["headers"].items() if k.lower() in ("authorization", "x-api-key", "api-key")}


def _call_both(url: str, up: HostileUpstream) -> tuple[dict, dict]:
    """A chat call and a Messages call, each with every client credential header; what reached the upstream."""
    r = httpx.post(f"{url}/s/k/v1/chat/completions", json=CHAT, headers=CLIENT_HEADERS)
    assert r.status_code == 200, r.text
    chat = _credentials(up.received[-1])
    r = httpx.post(f"{url}/s/k/v1/messages", json=MESSAGES, headers=CLIENT_HEADERS)
    assert r.status_code == 200, r.text
    assert up.received[-1]["path"].endswith("/messages")
    return chat, _credentials(up.received[-1])


def _no_key_written(folder: Path, *keys: str) -> None:
    for f in (p for p in folder.rglob("*") if p.is_file()):
        data = f.read_bytes()
        assert not any(k.encode() in data for k in keys), f


def test_the_openai_key_goes_only_to_openai_calls_and_alone(hostile, tmp_path, monkeypatch):
    """OPENAI_API_KEY set: chat calls carry it as their only credential; a Messages call never gets it (before
    issue 36 it went there as a Bearer key beside the client's x-api-key, and the client's x-api-key and api-key
    went beside it on chat calls)."""
    _no_keys(monkeypatch)
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    with running_proxy(make_settings(), hostile.base_url, str(tmp_path / "rec")) as url:
        chat, messages = _call_both(url, hostile)
    assert chat == {"authorization": f"Bearer {ENV_KEY}"}
    assert ENV_KEY not in json.dumps(messages)
    assert messages == {"authorization": f"Bearer {CLIENT_BEARER}", "x-api-key": CLIENT_X, "api-key": CLIENT_AZURE}
    _no_key_written(tmp_path / "rec", ENV_KEY, CLIENT_BEARER, CLIENT_X, CLIENT_AZURE)


def test_the_anthropic_key_goes_only_to_messages_calls_as_x_api_key(hostile, tmp_path, monkeypatch):
    _no_keys(monkeypatch)
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    with running_proxy(make_settings(), hostile.base_url, str(tmp_path / "rec")) as url:
        chat, messages = _call_both(url, hostile)
    assert messages == {"x-api-key": ANTHROPIC_KEY}
    assert chat == {"authorization": f"Bearer {ENV_KEY}"}
    # configured under other variable names: only those are read
    monkeypatch.setenv("MY_OAI", "sk-my-oai-7")
    monkeypatch.setenv("MY_ANT", "sk-my-ant-8")
    settings = make_settings(proxy={"openai_key_env": "MY_OAI", "anthropic_key_env": "MY_ANT"})
    with running_proxy(settings, hostile.base_url, str(tmp_path / "rec2")) as url:
        chat, messages = _call_both(url, hostile)
    assert chat == {"authorization": "Bearer sk-my-oai-7"} and messages == {"x-api-key": "sk-my-ant-8"}
    _no_key_written(tmp_path / "rec", ENV_KEY, ANTHROPIC_KEY)


def test_pass_client_key_false_strips_every_client_credential(hostile, tmp_path, monkeypatch):
    _no_keys(monkeypatch)
    with running_proxy(make_settings(proxy={"pass_client_key": False}), hostile.base_url, str(tmp_path / "rec")) as url:
        chat, messages = _call_both(url, hostile)
    assert chat == {} and messages == {}
    with running_proxy(make_settings(), hostile.base_url, str(tmp_path / "rec2")) as url:  # default: passed as sent
        chat, messages = _call_both(url, hostile)
    assert chat == messages == {"authorization": f"Bearer {CLIENT_BEARER}", "x-api-key": CLIENT_X,
                                "api-key": CLIENT_AZURE}


# 7. refused calls cannot fill the disk (issue 36)


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_a_flood_of_refused_calls_is_counted_not_stored(hostile, tmp_path, monkeypatch):
    """Unauthenticated calls with 16 KB paths: before issue 36 every one was a record of its path's size (about
    13 MB here). Now at most the burst plus the rate is recorded, each with 256 characters of path; the others
    are counted, and every refused call is accounted for once the proxy stops. 800 calls, over ten times what the
    burst and the rate let through in the second or two they take (2,500 cost 6 s of CPU for the same check)."""
    _no_keys(monkeypatch)
    monkeypatch.setenv("EVOLFORGE_PROXY_TOKEN", "tok-flood")
    n, path = 800, "x" * 16_000
    settings = make_settings(proxy={"refused_records_per_second": 5.0, "refused_records_burst": 50})
    started = time.monotonic()
    with running_proxy(settings, hostile.base_url, str(tmp_path / "rec")) as url, httpx.Client() as client:
        for _ in range(n):
            assert client.post(f"{url}/s/f/v1/{path}", json=CHAT).status_code == 401
        ok = client.post(f"{url}/s/f/v1/chat/completions", json=CHAT, headers={"X-Evolforge-Proxy-Token": "tok-flood"})
        assert ok.status_code == 200  # the flood did not stop real calls from being served and recorded
    elapsed = time.monotonic() - started
    layout = ProxyLayout(tmp_path / "rec")
    recs = list(iter_records(layout))
    refused = [r for r in recs if r["session"] == "(refused)"]
    assert len(refused) <= 50 + 5 * elapsed + 2, (len(refused), elapsed)
    assert all(len(r["path"] or "") <= 256 and len(json.dumps(r)) < 2000 for r in refused)
    counted = sum(r.get("unrecorded_refusals") or 0 for r in refused)
    assert counted + sum(1 for r in refused if r["route"] != "(refusals)") == n
    assert [r["session"] for r in recs if r["session"] != "(refused)"] == ["f"]
    assert _folder_bytes(tmp_path / "rec") < 1_000_000, _folder_bytes(tmp_path / "rec")
    assert len(hostile.received) == 1
