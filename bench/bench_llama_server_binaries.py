"""Serving speed of llama-server binaries side by side (issue 27: the -O1 parts of the build against -O3 everywhere).

    .venv/bin/python bench/bench_llama_server_binaries.py NAME=BINARY NAME=BINARY [--rounds 2] [--port 18811]

Each binary serves the embedded GGUF (SmolLM2-135M-Instruct) as the embedded model does (8 slots, 1 thread,
continuous batching), in turn, `--rounds` times alternating; each gets 8 concurrent chats of at most 96 tokens,
plain and then with a json_schema response_format (a grammar), and the completion tokens/s of each batch are printed
and written as JSON to stdout's last line."""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from evolforge.tasks.core.embedded_model import default_model_path

SCHEMA = {"type": "object", "properties": {"verdict": {"type": "string", "enum": ["Equal", "Not Equal"]},
                                           "reason": {"type": "string", "maxLength": 120}},
          "required": ["verdict", "reason"], "additionalProperties": False}


def measure(binary: str, port: int) -> dict:
    proc = subprocess.Popen([binary, "--model", str(default_model_path()), "--host", "127.0.0.1", "--port", str(port),
                             "--threads", "1", "--threads-batch", "1", "--ctx-size", "16384", "--parallel", "8",
                             "--cont-batching", "--no-webui", "--jinja"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/v1/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)

        def call(i: int, schema: bool) -> int:
            body = {"model": "m", "max_tokens": 96, "temperature": 0,
                    "messages": [{"role": "user", "content": f"Write a short story about the number {i}."}]}
            if schema:
                body["response_format"] = {"type": "json_schema",
                                           "json_schema": {"name": "v", "schema": SCHEMA, "strict": True}}
            return httpx.post(url + "/v1/chat/completions", json=body, timeout=300).json()["usage"]["completion_tokens"]

        out = {}
        for schema in (False, True):
            t0 = time.monotonic()
            with ThreadPoolExecutor(8) as pool:
                tokens = sum(pool.map(lambda i: call(i, schema), range(8)))
            out["json_schema" if schema else "plain"] = round(tokens / (time.monotonic() - t0), 1)
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("binaries", nargs="+", help="NAME=PATH of a llama-server executable")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--port", type=int, default=18811)
    a = p.parse_args()
    named = [b.split("=", 1) for b in a.binaries]
    results: dict[str, list] = {}
    for _ in range(a.rounds):
        for name, binary in named:
            results.setdefault(name, []).append(measure(binary, a.port))
            print(name, results[name][-1], flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
