"""A scripted OpenAI-compatible chat server on loopback, for unit tests and benchmarks.

It answers `/v1/chat/completions` and `/v1/models` over real HTTP. Replies are
deterministic functions of the prompt (an evolve prompt gets a rewritten
instruction, the Equal judge gets "Not Equal", an answer prompt gets steps), so
a resumed run can be compared with an uninterrupted one. A request's stage is
recognised by the MARKER_* constants of the stages' prompt modules
(tasks/*/prompts.py), which their prompt templates are built from. Faults are scripted
per request with `server.script(...)`: a queue of actions consumed one per
request ("429", "503", "500", "hang", "401", "404", "400", "400rf" (a 400 naming
response_format), "malformed",
"truncated", "close", "ok"), then `default`.

Every request is logged (`server.requests`) with a hash of its body and whether
a full reply was sent, so tests can prove from the server side that no
completed call was repeated, and the `response_format` it carried.

Structured outputs: the Equal judge asked for a json_schema gets `{"verdict": ...}`; `server.reject_formats`
(a set of response_format types, e.g. {"json_schema", "json_object"}) answers a request carrying one of them
with `server.reject_format_status` (400) and an error naming the field, as an endpoint without structured
outputs does.

Run standalone: python testing/scripted_server.py --port 8099 [--log FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import random
import re
import socket
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from evolforge.config.sections.gateway import ModelMap
from evolforge.tasks.core.gateway import PREFLIGHT_PROMPT
from evolforge.tasks.evolve import prompts as evolve_prompts
from evolforge.tasks.modules import prompts as module_prompts
from evolforge.tasks.reward import prompts as reward_prompts
from evolforge.tasks.synthesis import prompts as synthesis_prompts
from evolforge.testing.net import SERVE_POLL

VOCAB = """river mountain compute budget tensor violin harbor prime matrix glacier poem invoice garden
orbit enzyme ledger canyon sonnet circuit falcon recipe theorem lantern vaccine border quartz marathon
parliament saddle cobalt tariff monsoon archive pixel lattice meadow cipher drought crater bakery
turbine ballot coral sparrow voltage census magnet compass velvet pepper summit cactus beacon""".split()


# what GET /models lists (the server answers any model name): its own, and the embedded model's name, which
# every run without --model sends (the input check refuses a model the endpoint does not list)
MODELS = ("scripted", ModelMap().default)

SYNTH_GOOD = "def add_numbers(a, b):\n    return a + b\n"
SYNTH_BAD = "def add_numbers(a, b):\n    return a - b\n"
SYNTH_EQ_TESTS = ("from solution import add_numbers\n\n"
                  "def test_add():\n    assert add_numbers(2, 3) == 5\n    assert add_numbers(-1, 1) == 0\n"
                  "    assert add_numbers(0, 0) == 0\n    assert add_numbers(10, 5) == 15\n")
SYNTH_TESTS = SYNTH_EQ_TESTS + "    assert isinstance(add_numbers(2, 3), int)\n"  # an always-equal object fails this
# tests that hand the solution something the sandbox's runner/solution channel cannot carry (a lock)
SYNTH_UNCHECKABLE_TESTS = SYNTH_TESTS + ("\ndef test_lock():\n    import threading\n\n    import pytest\n\n"
                                         "    with pytest.raises(TypeError):\n        add_numbers(threading.Lock(), 0)\n")


_SPLIT_VOTES = itertools.count()  # a SPLITVOTE solver's answers: never the same twice


def synthesis_reply(prompt: str) -> str | None:
    """Scripted answers to the task-synthesis prompts (tasks/synthesis/prompts.py).

    A seed instruction containing BUGGY gets a wrong reference first (exercises the repair loop), one containing
    TRIVIAL gets tests that assert nothing, one containing EQONLY tests that only compare results with == (an
    object equal to everything would pass them in one process), one containing UNCHECKABLE tests that pass the
    solution a lock (not checkable through the sandbox's channel), one containing UNSOLVABLE gets solver answers
    that fail. A code repair always returns the good solution and SYNTH_TESTS.

    Math: a seed containing WRONGANSWER gets a wrong reference answer (3*5; the solvers answer 12), one containing
    SPLITVOTE solvers that never agree (their answers follow the prompt's hash), one containing STUBBORN a math repair
    that changes nothing (the marker is carried into the problem, so the repair prompt sees it); any other math
    repair returns the answer 3*4.
    """
    if synthesis_prompts.MARKER_PROPOSE_CODE in prompt:
        tests = ("def test_nothing():\n    assert True\n" if "TRIVIAL" in prompt
                 else SYNTH_EQ_TESTS if "EQONLY" in prompt
                 else SYNTH_UNCHECKABLE_TESTS if "UNCHECKABLE" in prompt else SYNTH_TESTS)
        return json.dumps({"statement": "Write add_numbers(a, b) returning the sum of two integers, e.g. "
                           "add_numbers(2, 3) == 5. Seed: " + hashlib.sha1(prompt.encode()).hexdigest()[:8]
                           + (" UNSOLVABLE" if "UNSOLVABLE" in prompt else ""),
                           "entry_point": "add_numbers", "solution": SYNTH_BAD if "BUGGY" in prompt else SYNTH_GOOD,
                           "tests": tests})
    if synthesis_prompts.MARKER_REPAIR_CODE in prompt:
        return json.dumps({"fixed": "solution", "solution": SYNTH_GOOD, "tests": SYNTH_TESTS,
                           "explanation": "the reference subtracted instead of adding"})
    if synthesis_prompts.MARKER_SOLVE_CODE in prompt:
        code = SYNTH_BAD if "UNSOLVABLE" in prompt else SYNTH_GOOD
        return f"Here you go:\n```python\n{code}```"
    if synthesis_prompts.MARKER_PROPOSE_MATH in prompt:
        wrong = "WRONGANSWER" in prompt
        marks = "".join(f" {m}" for m in ("STUBBORN", "SPLITVOTE") if m in prompt)
        return json.dumps({"problem": "Ann buys 3 boxes of 4 apples. How many apples? "
                           + hashlib.sha1(prompt.encode()).hexdigest()[:6] + marks,
                           "steps": ["Step 1: 3 boxes of 4 apples is 3*4."], "answer": "3*5" if wrong else "3*4"})
    if synthesis_prompts.MARKER_REPAIR_MATH in prompt:
        problem = prompt.split("Problem:\n", 1)[-1].split("\n\nReference solution steps:", 1)[0]
        answer = prompt.split("Reference answer: ", 1)[-1].split("\n", 1)[0]
        if "STUBBORN" in prompt:
            return json.dumps({"fixed": "answer", "problem": problem, "answer": answer, "explanation": "it is right"})
        return json.dumps({"fixed": "answer", "problem": problem.replace(" SPLITVOTE", ""), "answer": "3*4",
                           "explanation": "3 boxes of 4 apples are 12 apples"})
    if synthesis_prompts.MARKER_SOLVE_MATH in prompt:
        if "SPLITVOTE" in prompt:  # each attempt its own answer: no majority
            return f"Step 1: guess.\nThe answer is: {100 + next(_SPLIT_VOTES)}"
        return "Step 1: 3 * 4 = 12.\nThe answer is: 12"
    return None


def reply_for(body: dict, judge_verdict: str = "Not Equal") -> str:
    msgs = body.get("messages") or []
    prompt = msgs[-1]["content"] if msgs else ""
    h = hashlib.sha1(prompt.encode()).hexdigest()[:6]
    fmt = (body.get("response_format") or {}).get("type")
    if evolve_prompts.MARKER_EQUAL_JUDGE in prompt:
        if fmt == "json_schema" and judge_verdict in ("Equal", "Not Equal"):
            return json.dumps({"verdict": judge_verdict})
        return judge_verdict
    reward = reward_reply(prompt)
    if reward is not None:
        return reward
    synth = synthesis_reply(prompt)
    if synth is not None:
        return synth
    if is_evolve_prompt(prompt):
        # a fresh, distinct instruction per prompt (so dedup keeps it): words drawn by the prompt's hash
        rng = random.Random(int(hashlib.sha1(prompt.encode()).hexdigest(), 16))
        words = " ".join(rng.choice(VOCAB) for _ in range(14))
        return f"{words.capitalize()} {h}?"
    if fmt in ("json_object", "json_schema"):
        return '```json\n{"ok": true, "id": "%s"}\n```' % h
    return f"Step 1: Read the task carefully {h}.\nStep 2: Work out the result.\nThe answer is: 42"


def is_evolve_prompt(prompt: str) -> bool:
    """An Evol-Instruct rewrite / create / code prompt (tasks/evolve/prompts.py)."""
    return any(marker in prompt for marker in evolve_prompts.MARKER_EVOLVE)


def _solution_steps(prompt: str, marker: str, until: str | None = None) -> list[str]:
    """The `Step N: ...` lines after `marker` (up to the first `until` after it, when given)."""
    section = prompt.split(marker, 1)[1] if marker in prompt else ""
    if until is not None:
        section = section.split(until, 1)[0]
    return re.findall(r"^Step \d+: (.*)$", section, re.M)


def reward_reply(prompt: str) -> str | None:
    """Reward-data prompts (tasks/reward/prompts.py), answered deterministically:
    - IRM ranking: longer versions rank higher (a scripted version is a 14-word sentence, longer than the
      short instructions the tests use), with scores 9 (best) down to 3 (worst);
    - PRM step labels: a step is incorrect when it contains the word 'wrong' (fenced JSON);
    - DeCoRL score: 2 + 2 per step without 'wrong' - 3 per step with it, clipped to 0..10;
    - Math-Shepherd continuation: 'The answer is: 42', or 7 when a prefix step contains 'wrong'."""
    rp = reward_prompts
    if prompt.startswith(rp.MARKER_RANK):
        versions = re.findall(r"^\[([A-Z])\] (.*)$", prompt, re.M)
        order = [lab for lab, _ in sorted(versions, key=lambda v: (-len(v[1]), v[0]))]
        n = len(order)
        scores = {lab: round(9 - 6 * i / max(1, n - 1), 2) for i, lab in enumerate(order)}
        return json.dumps({"ranking": order, "scores": scores})
    if rp.MARKER_STEP_LABELS in prompt:
        steps = _solution_steps(prompt, rp.SOLUTION_HEADING, until="\n\n")
        return "```json\n" + json.dumps({"labels": ["wrong" not in s.lower() for s in steps]}) + "\n```"
    if rp.MARKER_SCORE in prompt:
        steps = _solution_steps(prompt, rp.SOLUTION_HEADING, until="\n\n")
        bad = sum("wrong" in s.lower() for s in steps)
        return json.dumps({"score": max(0, min(10, 2 + 2 * (len(steps) - bad) - 3 * bad))})
    if rp.MARKER_CONTINUE in prompt:
        wrong = any("wrong" in s.lower() for s in _solution_steps(prompt, rp.MARKER_CONTINUE))
        return "Step 9: Finish the computation.\nThe answer is: " + ("7" if wrong else "42")
    return None


MODULE_CONTENT = {  # a valid `content` per output type (tasks/modules/schema.py)
    "steps": ["Identify what the question asks", "Work out the result from the given numbers"],
    "concepts": ["quantity", "arithmetic"],
    "entities": {"question": "what is asked"},
    "verdict": {"ok": True, "issues": []},
    "result": 42,
    "alternatives": ["The answer is 42.", "It comes to 42."],
    "final": "The answer is 42.",
}
CORRUPTED_CONTENT = {  # what a corrupted module says instead: valid, but wrong (the judge sees the marker)
    "steps": ["CORRUPTED step: divide by zero"], "concepts": ["CORRUPTED concept"],
    "entities": {"CORRUPTED": "CORRUPTED"}, "verdict": {"ok": False, "issues": ["CORRUPTED check"]},
    "result": "CORRUPTED 41", "alternatives": ["CORRUPTED phrasing"], "final": "CORRUPTED answer 41",
}
MODULE_FAULTS = ("invalid_json", "missing_fields", "wrong_content", "bad_confidence")
_MODULE_HEAD = re.compile(re.escape(module_prompts.MARKER_MODULE) + r" (\S+) \(output: (\w+)\)")
_MODULE_DEPS = re.compile("^" + re.escape(module_prompts.MARKER_DEPENDENCIES) + r" (.*)$", re.M)
_REMOVED = re.compile(re.escape(module_prompts.REMOVED).replace(re.escape("{id}"), r"\S+"))


def _penalty(table: dict[str, float] | None, question: str) -> float:
    """The points of the longest key of `table` found in the question ("" matches every question), else 0."""
    keys = [k for k in (table or {}) if k in question]
    return float(table[max(keys, key=len)]) if keys else 0.0


def module_reply(body: dict, corrupt_module: str | None = None, fault_rate: float = 0.0,
                 truncate_below: int = 0, plain_penalty: dict[str, float] | None = None,
                 graph_penalty: dict[str, float] | None = None) -> tuple[str, str] | None:
    """(text, finish_reason) for the module-DAG prompts (tasks/modules/prompts.py), else None.

    A module prompt (first line `MARKER_MODULE ID (output: TYPE)`, also on a re-ask) gets a valid
    {type, content, confidence, dependencies} object; the module `corrupt_module` gets valid JSON whose content
    says CORRUPTED. `fault_rate` of the replies (chosen by a hash of the request, so a re-ask draws anew) are
    schema faults: invalid JSON, missing fields, content of the wrong type, or a confidence over 1. A reply whose
    max_tokens is under `truncate_below` is cut in half with finish_reason 'length'.
    The judge prompt (MARKER_MODULE_JUDGE) scores the text between MARKER_ANSWER and MARKER_ANSWER_END:
    10 - 1 per '[module X removed]' - 5 when it says CORRUPTED, clipped to 0..10. For the comparison
    (tasks/modules/compare.py) it also takes off `graph_penalty[key]` from an answer with MARKER_MODULE_TRACE (the
    graph's) and `plain_penalty[key]` from one without (the single-shot's), key: the longest key found in the
    judged question ("" matches all); both empty by default."""
    msgs = body.get("messages") or []
    prompt = str(msgs[-1].get("content", "")) if msgs else ""
    mp = module_prompts
    if prompt.startswith(mp.MARKER_MODULE_JUDGE):
        answer = prompt.split(mp.MARKER_ANSWER, 1)[-1].split(mp.MARKER_ANSWER_END, 1)[0]
        removed = len(_REMOVED.findall(answer))
        score = 10 - removed - (5 if "CORRUPTED" in answer else 0)
        question = prompt.split(mp.MARKER_QUESTION, 1)[-1].split(mp.MARKER_ANSWER, 1)[0]
        score -= _penalty(graph_penalty if mp.MARKER_MODULE_TRACE in answer else plain_penalty, question)
        return json.dumps({"score": max(0, min(10, score))}), "stop"
    head = _MODULE_HEAD.match(prompt)
    if not head:
        return None
    module, kind = head.group(1), head.group(2)
    deps_line = _MODULE_DEPS.search(prompt)
    deps = [d.strip() for d in deps_line.group(1).split(",")] if deps_line and deps_line.group(1) != "none" else []
    content = (CORRUPTED_CONTENT if module == corrupt_module else MODULE_CONTENT).get(kind, "?")
    reply = {"type": kind, "content": content, "confidence": 0.8, "dependencies": deps}
    digest = hashlib.sha256(json.dumps([msgs, body.get("max_tokens")], sort_keys=True).encode()).digest()
    if fault_rate and int.from_bytes(digest[:4], "big") / 2**32 < fault_rate:
        fault = MODULE_FAULTS[digest[4] % len(MODULE_FAULTS)]
        if fault == "invalid_json":
            return '{"type": "%s", "content": [oops' % kind, "stop"
        if fault == "missing_fields":
            reply = {"type": kind, "content": content}
        elif fault == "wrong_content":
            reply["content"] = {"unexpected": True}
        else:
            reply["confidence"] = 7
    text = json.dumps(reply)
    if truncate_below and (body.get("max_tokens") or 0) < truncate_below:
        return text[: len(text) // 2], "length"
    return text, "stop"


def completion(body: dict, text: str) -> dict:
    return {
        "id": "chatcmpl-scripted", "object": "chat.completion", "created": int(time.time()),
        "model": body.get("model", "scripted"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": max(1, len(str(body.get("messages"))) // 4),
                  "completion_tokens": max(1, len(text) // 4),
                  "total_tokens": 0},
    }


def _is_probe(body: dict) -> bool:
    msgs = body.get("messages") or []
    return len(msgs) == 1 and msgs[0].get("content") == PREFLIGHT_PROMPT


class ScriptedServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, hang_seconds: float = 5.0,
                 latency: float = 0.0, log_path: str | None = None, default: str = "ok", nodelay: bool = True):
        self.actions: deque[str] = deque()
        self.default = default
        self.judge_verdict = "Not Equal"
        self.poison: str | None = None  # requests whose body contains this string get HTTP 500
        self.evolve_overrides: dict[str, str] = {}  # evolve prompts containing KEY are answered with VALUE
        self.hang_seconds = hang_seconds
        self.latency = latency
        # TCP_NODELAY on replies (as uvicorn and llama-server do): without it every reply (headers, then body in a
        # second small write) stalls ~40 ms on Nagle + the client's delayed ACK: 44 ms per call instead of 0.3-1 ms
        self.nodelay = nodelay
        self.requests: list[dict] = []
        # The gateway's pre-flight probes (one per model at the start of a flow) are answered with
        # `preflight_action` and kept apart in `probes`: scripted faults and `posts()` are about the work.
        self.preflight_action = "ok"
        self.probes: list[dict] = []
        self.unknown_models: set[str] = set()  # a probe naming one of these is answered 404 (model not found)
        self.models: list[str] = list(MODELS)  # what GET /models lists
        self.props: object = None  # what GET /props answers (as llama-server: {"total_slots": N}); None: 404
        self.props_requests = 0  # GET /props received
        # response_format types this server refuses (HTTP reject_format_status, an error naming the field)
        self.reject_formats: set[str] = set()
        self.reject_format_status = 400
        # module-DAG prompts (see module_reply): a module whose replies are corrupted, the share of module
        # replies that are schema faults, a max_tokens under which replies are truncated, and extra latency
        # per module id (on top of `latency`)
        self.corrupt_module: str | None = None
        self.module_fault_rate = 0.0
        self.module_truncate_below = 0
        self.module_latency: dict[str, float] = {}
        # the comparison's judge: points off a single-shot answer (no "Module trace") / a graph answer, per
        # question substring ("" for every question; the longest key found wins); see module_reply
        self.judge_plain_penalty: dict[str, float] = {}
        self.judge_graph_penalty: dict[str, float] = {}
        self.lock = threading.Lock()
        self.log_path = log_path
        self._log_fh = open(log_path, "a", buffering=1) if log_path else None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def setup(self):
                super().setup()
                if outer.nodelay:
                    self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_GET(self):
                if self.path.rstrip("/").endswith("/models"):
                    self._json(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in outer.models]})
                elif self.path.rstrip("/") == "/props":
                    with outer.lock:
                        outer.props_requests += 1
                    if outer.props is None:
                        self._json(404, {"error": {"message": "not found"}})
                    else:
                        self._json(200, outer.props)
                else:
                    self._json(404, {"error": {"message": "not found"}})

            def do_POST(self):
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {}
                key = hashlib.sha256(raw).hexdigest()[:16]
                if _is_probe(body):
                    action = "404" if body.get("model") in outer.unknown_models else outer.preflight_action
                    entry = {"key": key, "action": action, "completed": False, "t": time.time(),
                             "auth": self.headers.get("authorization", ""), "model": body.get("model")}
                    with outer.lock:
                        outer.probes.append(entry)
                    return self._act(action, body, entry)
                with outer.lock:
                    scripted = bool(outer.actions)
                    action = outer.actions.popleft() if scripted else outer.default
                if outer.poison and outer.poison.encode() in raw:
                    action = "500"
                fmt = body.get("response_format") if isinstance(body.get("response_format"), dict) else None
                msgs = body.get("messages") if isinstance(body.get("messages"), list) else []
                last = msgs[-1] if msgs and isinstance(msgs[-1], dict) else {}
                entry = {"key": key, "action": action, "completed": False, "t": time.time(),
                         "auth": self.headers.get("authorization", ""), "response_format": fmt,
                         "model": body.get("model"), "prompt": last.get("content")}  # the last message's text
                with outer.lock:
                    outer.requests.append(entry)
                if fmt and fmt.get("type") in outer.reject_formats:
                    entry["action"] = f"reject-{fmt.get('type')}"
                    if scripted:  # the scripted action was not used: it stays for the next request
                        with outer.lock:
                            outer.actions.appendleft(action)
                    return self._json(outer.reject_format_status, {"error": {
                        "message": f"response_format type {fmt.get('type')!r} is not supported by this server",
                        "type": "invalid_request_error", "param": "response_format"}})
                if outer.latency:
                    time.sleep(outer.latency)
                if outer.module_latency:
                    head = _MODULE_HEAD.match(str((body.get("messages") or [{}])[-1].get("content", "")))
                    if head and outer.module_latency.get(head.group(1)):
                        time.sleep(outer.module_latency[head.group(1)])
                self._act(action, body, entry)

            def _act(self, action, body, entry):
                if action.startswith("429ra:"):
                    return self._json(429, {"error": {"message": "slow down"}}, {"retry-after": action[6:]})
                if action in ("429", "503", "500", "502"):
                    headers = {"retry-after": "0"} if action == "429" else {}
                    return self._json(int(action), {"error": {"message": f"scripted {action}"}}, headers)
                if action in ("400", "401", "404"):
                    return self._json(int(action), {"error": {"message": f"scripted {action}", "type": "invalid"}})
                if action == "400rf":  # a 400 that names the structured-output field
                    return self._json(400, {"error": {"message": "scripted 400: invalid response_format schema",
                                                      "type": "invalid"}})
                if action == "hang":
                    time.sleep(outer.hang_seconds)
                    return self._json(200, completion(body, reply_for(body)))
                if action == "malformed":
                    data = b'{"id": "x", "choices": [ {"message": '
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if action == "truncated":
                    data = json.dumps(completion(body, reply_for(body))).encode()
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                if action == "close":
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                if action.startswith("text:"):
                    text = action[5:]
                else:
                    text = reply_for(body, outer.judge_verdict)
                    prompt = str((body.get("messages") or [{}])[-1].get("content", ""))
                    if is_evolve_prompt(prompt):
                        for key, value in outer.evolve_overrides.items():
                            if key in prompt:
                                text = value
                resp = completion(body, text)
                module = None if action.startswith("text:") else module_reply(
                    body, outer.corrupt_module, outer.module_fault_rate, outer.module_truncate_below,
                    outer.judge_plain_penalty, outer.judge_graph_penalty)
                if module is not None:
                    resp = completion(body, module[0])
                    resp["choices"][0]["finish_reason"] = module[1]
                self._json(200, resp)
                entry["completed"] = True
                if outer._log_fh:
                    outer._log_fh.write(json.dumps({"key": entry["key"], "completed": True}) + "\n")

            def _json(self, status, obj, headers=None):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(data)
                except OSError:
                    pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = 256

        self.httpd = Server((host, port), Handler)
        self.port = self.httpd.server_address[1]
        self.base_url = f"http://{host}:{self.port}/v1"
        self._thread: threading.Thread | None = None

    def script(self, *actions: str) -> "ScriptedServer":
        with self.lock:
            self.actions.extend(actions)
        return self

    def posts(self) -> list[dict]:
        with self.lock:
            return list(self.requests)

    def start(self) -> "ScriptedServer":
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": SERVE_POLL}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._log_fh:
            self._log_fh.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8099)
    ap.add_argument("--latency", type=float, default=0.0)
    ap.add_argument("--log", default=None)
    a = ap.parse_args()
    srv = ScriptedServer(port=a.port, latency=a.latency, log_path=a.log)
    print(f"scripted server on {srv.base_url}", flush=True)
    srv.httpd.serve_forever()
