"""The user errors of the command line, as a table: each row a command line with its setup, the exit status, a
piece of the one line it prints, and the fix (what the troubleshooting page says). tests/cli/test_error_table.py
runs every row (no traceback, one line, the folder it names not created); the documentation builds its
troubleshooting page from `ROWS` (`troubleshooting_markdown()`). Add a row for every new user error.

    Case(id, argv, code, says, fix, setup=..., env=..., how="inprocess" | "subprocess" | "interrupt")

`argv` and `env` values may name what the setup made: {tmp} (the test's folder), {out} (an output folder that
must not be created), {seeds}, {url} (a scripted OpenAI-compatible server; setups "models-elsewhere" and
"model-404" change what it lists / answers), {web} (a server answering web pages), {busy} (a port something
listens on), {run} (an evolve run folder), {evolved} (an evolved.parquet), {pipeline} (a pipeline folder).
`how`: in-process through `evolforge.cli.main` (fast), a fresh `evolforge` process (errors after Prefect starts),
or a server process stopped with Ctrl-C once it printed its banner.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

from evolforge.testing.net import SERVE_POLL


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    code: int
    says: str  # a substring of the one line (of the output, when `lines` is None)
    fix: str  # what the user does: the troubleshooting page's text
    setup: tuple[str, ...] = ()  # the SETUPS this row needs
    env: dict[str, str] = field(default_factory=dict)
    how: str = "inprocess"
    lines: int | None = 1  # lines on stderr (None: not counted, e.g. the command list)
    symptom: str = ""  # what the user did, in words (default: the command line)


ROWS: tuple[Case, ...] = (
    Case("no-subcommand", (), 2, "commands:", "Run `evolforge COMMAND`; `evolforge COMMAND --help` lists its flags.",
         lines=None, symptom="`evolforge` with no command"),
    Case("rounds-0", ("run", "--seeds", "{seeds}", "--out", "{out}", "--rounds", "0"), 2,
         "--rounds 0: input should be greater than or equal to 1", "Give --rounds 1 or more.", ("seeds",)),
    Case("max-items-0", ("modules", "--input", "{seeds}", "--out", "{out}", "--max-items", "0"), 2,
         "--max-items 0: input should be greater than or equal to 1",
         "Give --max-items 1 or more, or leave it out to take every question.", ("seeds",)),
    Case("ppo-local-steps", ("ppo", "--evolved", "{evolved}", "--reward-dir", "{tmp}", "--out", "{out}",
                             "--local-steps", "-1"), 2, "--local-steps -1: input should be greater than or equal to 0",
         "Give --local-steps 0 (no local GRPO run) or more.", ("evolved",)),
    Case("costs-by-unknown", ("costs", "--out", "{tmp}", "--by", "colour"), 2, "--by colour: colour is not a ledger column",
         "Group by stage, model, task_id, run_id, outcome, price_source or http_status (comma-separated)."),
    Case("costs-missing-folder", ("costs", "--out", "{out}"), 2, "does not exist",
         "Pass the output folder of a run with --out."),
    Case("costs-pipeline", ("costs", "--out", "{pipeline}", "--by", "stage"), 0, "evolve",
         "Nothing to fix: a pipeline folder's costs are the ledgers of all its stages.", ("pipeline",), lines=None),
    Case("resume-other-seeds", ("run", "--seeds", "{tmp}/other-seeds.jsonl", "--out", "{run}"), 2,
         "holds a run started from other inputs (seed file changed",
         "Resume with the run's own seed file, give a new --out, or pass --force-settings to go on with the new "
         "seeds (recorded in run.json).", ("seeds", "run"), lines=1),
    Case("resume-other-model", ("run", "--seeds", "{seeds}", "--out", "{run}", "--model", "another-model"), 2,
         "models.answer 'smollm2-135m-instruct' -> 'another-model'",
         "Resume with the run's own model, give a new --out, or pass --force-settings.", ("seeds", "run")),
    Case("ppo-reward-folder-without-models", ("ppo", "--evolved", "{evolved}", "--reward-dir", "{tmp}/empty-reward",
                                              "--out", "{out}"), 2, "pass --reward-dir the output folder of a finished "
         "train-reward run", "Point --reward-dir at a train-reward output folder (models/irm, models/prm), or "
         "--irm-dir / --prm-dir at the model folders.", ("evolved", "empty-reward")),
    Case("ppo-unhealthy-reward-stop", ("ppo", "--evolved", "{evolved}", "--reward-dir", "{tmp}/unhealthy-reward",
                                       "--out", "{out}"), 2, "run anyway with --ignore-reward-health",
         "Fix the reward models, or pass --ignore-reward-health (pipeline takes it too), or set "
         "reward.health_policy = \"warn\".", ("evolved", "unhealthy-reward"),
         env={"EVOLFORGE__REWARD__HEALTH_POLICY": "stop"}),
    Case("not-openai-compatible", ("run", "--seeds", "{seeds}", "--out", "{out}", "--base-url", "{web}"), 2,
         "does not answer like an OpenAI-compatible API",
         "Give the API's base URL, which usually ends in /v1 (http://host:8000/v1).", ("seeds", "web")),
    Case("model-not-served", ("run", "--seeds", "{seeds}", "--out", "{out}", "--base-url", "{url}"), 2,
         "does not serve 'smollm2-135m-instruct' (models.default, the embedded model's name: no --model was given); "
         "it serves: org/llama-3-8b", "Pass --model with a model the endpoint lists.", ("seeds", "models-elsewhere")),
    Case("preflight-fails-in-flow", ("run", "--seeds", "{seeds}", "--out", "{out}", "--base-url", "{url}"), 2,
         "pre-flight failed for model 'smollm2-135m-instruct'",
         "Check the model name and key the endpoint expects (`evolforge preflight --base-url URL --model M`).",
         ("seeds", "model-404"), how="subprocess"),
    Case("unpriced-model-usd-budget", ("synthesize", "--seeds", "{seeds}", "--out", "{out}", "--base-url", "{url}"),
         2, "has no known price, so with synthesis.budget_usd_per_task = 0.25 every task would be rejected",
         "Add [pricing.overrides.\"MODEL\"] (input_per_mtok, output_per_mtok), or set synthesis.budget_usd_per_task "
         "= 0.", ("seeds", "url")),
    Case("env-wrong-type", ("run", "--seeds", "{seeds}", "--out", "{out}"), 2,
         "gateway.timeout_seconds: Input should be a valid number, unable to parse string as a number (got 'abc', "
         "from environment variable EVOLFORGE__GATEWAY__TIMEOUT_SECONDS)",
         "Fix or unset the environment variable the message names.", ("seeds",),
         env={"EVOLFORGE__GATEWAY__TIMEOUT_SECONDS": "abc"}),
    Case("env-unknown-key", ("run", "--seeds", "{seeds}", "--out", "{out}"), 2,
         "gateway.timeouts: unknown key (from environment variable EVOLFORGE__GATEWAY__TIMEOUTS",
         "Fix the variable's name (EVOLFORGE__SECTION__KEY, the keys of config/sections/) or unset it.", ("seeds",),
         env={"EVOLFORGE__GATEWAY__TIMEOUTS": "3"}),
    Case("flag-out-of-range", ("proxy", "--port", "99999", "--upstream", "{url}", "--out", "{out}"), 2,
         "proxy.port: Input should be less than or equal to 65535 (got 99999, from --port)",
         "Give the flag a valid value.", ("url",)),
    Case("config-file-wrong-type", ("run", "--seeds", "{seeds}", "--out", "{out}", "--config", "{tmp}/bad.toml"), 2,
         "evol_instruct.rounds: Input should be a valid integer", "Fix the key in the config file the message names.",
         ("seeds", "bad-config")),
    Case("dedup-no-such-field", ("dedup", "--input", "{tmp}/other-field.jsonl", "--text-field", "x", "--out", "{out}"),
         2, "no row has the field 'x' (its rows have: other; pass --text-field",
         "Pass --text-field with the column that holds the text.", ("other-field",)),
    Case("proxy-busy-port", ("proxy", "--port", "{busy}", "--upstream", "{url}", "--out", "{out}"), 2,
         "cannot listen on 127.0.0.1:{busy}", "Choose another --port, or stop what listens there.", ("busy", "url")),
    Case("sandbox-serve-busy-port", ("sandbox-serve", "--port", "{busy}"), 2, "cannot listen on 127.0.0.1:{busy}",
         "Choose another --port, or stop what listens there.", ("busy",)),
    Case("proxy-ctrl-c", ("proxy", "--port", "{port}", "--upstream", "{url}", "--out", "{tmp}/proxy"), 0, "",
         "Nothing to fix: Ctrl-C stops the proxy (its records are flushed).", ("url", "port"), how="interrupt",
         lines=0, symptom="Ctrl-C on `evolforge proxy`"),
    Case("sandbox-serve-ctrl-c", ("sandbox-serve", "--port", "{port}"), 0, "",
         "Nothing to fix: Ctrl-C stops the sandbox service.", ("port",), how="interrupt", lines=0,
         symptom="Ctrl-C on `evolforge sandbox-serve`"),
    Case("missing-seed-file", ("run", "--seeds", "{tmp}/nope.jsonl", "--out", "{out}"), 2, "seed file not found",
         "Give --seeds an existing jsonl, parquet or csv file."),
    Case("seed-file-is-a-folder", ("run", "--seeds", "{tmp}", "--out", "{out}"), 2, "seed file {tmp} is a folder",
         "Give --seeds the jsonl, parquet or csv file inside the folder."),
    Case("out-empty", ("run", "--seeds", "{seeds}", "--out", ""), 2, "--out is empty: name the output folder",
         "Give --out a folder (an empty value would write the run into the current folder).", ("seeds",),
         symptom='`evolforge run --seeds S --out ""`'),
    Case("config-is-a-folder", ("run", "--seeds", "{seeds}", "--out", "{out}", "--config", "{tmp}"), 2,
         "config file {tmp} is a folder: pass --config a TOML file", "Give --config the TOML file, not its folder.",
         ("seeds",)),
    Case("config-wrong-type-under-a-flag", ("run", "--seeds", "{seeds}", "--out", "{out}", "--config",
                                            "{tmp}/bad.toml", "--rounds", "2"), 2,
         "(got 'many', from {tmp}/bad.toml)",
         "Fix the key in the config file: it is checked before a flag or variable overrides it.",
         ("seeds", "bad-config")),
    Case("nightly-not-a-dataset", ("nightly", "--dataset", "{out}", "--seeds", "{seeds}", "--base-url", "{url}",
                                   "--model", "scripted"), 2, "is not a nightly dataset (no stage.json of the nightly "
         "stage): check the path, or pass --new", "Check the --dataset path (a mistyped one would start a new chain "
         "from --seeds), or pass --new to start a new dataset there.", ("seeds", "url")),
    Case("tls-certificate", ("run", "--seeds", "{seeds}", "--out", "{out}", "--base-url", "{tls}"), 2,
         "its TLS certificate does not verify", "Set gateway.ca_bundle (or SSL_CERT_FILE) to the CA bundle file that "
         "signs the endpoint's certificate.", ("seeds", "tls")),
    Case("out-in-use", ("run", "--seeds", "{seeds}", "--out", "{out}", "--base-url", "{url}", "--model", "scripted"),
         2, "is in use by another run (host ", "Wait for the other run to finish (`--wait` waits for it), or give "
         "another --out: one run writes to an output folder at a time.", ("seeds", "url", "locked-out"),
         symptom="a second `evolforge run` (or retry, nightly, a stage) over a folder another run is writing"),
)


def row(case_id: str) -> Case:
    return next(c for c in ROWS if c.id == case_id)


def troubleshooting_markdown() -> str:
    """The troubleshooting page's table: what you did, what evolforge says, the fix."""
    lines = ["| What you did | evolforge says (exit status) | Fix |", "|---|---|---|"]
    for c in ROWS:
        did = c.symptom or ("`evolforge " + " ".join(c.argv) + "`" + "".join(f" with {k}={v}" for k, v in c.env.items()))
        said = (f"`{c.says}`" if c.says else "(stops)") + f" ({c.code})"
        lines.append(f"| {did.replace('|', '/')} | {said.replace('|', '/')} | {c.fix.replace('|', '/')} |")
    return "\n".join(lines)


# ----------------------------------------------------------------- setups


class _WebPage(BaseHTTPRequestHandler):
    """A web server, not a model API: every path is an HTML page."""

    def _page(self):
        body = b"<!doctype html><html><body><h1>Welcome</h1></body></html>"
        self.send_response(200)
        self.send_header("content-type", "text/html; charset=utf-8")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _page

    def log_message(self, *a):
        pass


def _seeds(tmp: Path, name: str, rows: list[dict]) -> Path:
    path = tmp / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@contextlib.contextmanager
def prepared(case: Case, tmp: Path) -> Iterator[dict[str, str]]:
    """The values the case's argv / env name, with what its setup needs running until the block ends."""
    from evolforge.testing.net import free_port
    from evolforge.testing.scripted_server import ScriptedServer

    values = {"tmp": str(tmp), "out": str(tmp / "out")}
    need = set(case.setup)
    with contextlib.ExitStack() as stack:
        if need & {"seeds", "run"}:
            values["seeds"] = str(_seeds(tmp, "seeds.jsonl", [{"id": f"s{i}", "instruction": f"Add {i} and {i + 2}."}
                                                              for i in range(3)]))
            _seeds(tmp, "other-seeds.jsonl", [{"id": "o1", "instruction": "Name three rivers."}])
        if "run" in need:
            values["run"] = str(_evolve_run(tmp / "run", values["seeds"]))
        if "other-field" in need:
            _seeds(tmp, "other-field.jsonl", [{"other": "some text"}])
        if "tls" in need:  # an https endpoint whose certificate no default CA signs
            values["tls"], _ = stack.enter_context(tls_endpoint(tmp))
        if "locked-out" in need:  # another process holds the output folder's run lock (storage/locks.py)
            import subprocess
            import sys

            holder = subprocess.Popen([sys.executable, "-c", "import sys\nfrom evolforge.storage.locks import "
                                       "run_lock\nwith run_lock(sys.argv[1]):\n    print('held', flush=True)\n"
                                       "    sys.stdin.read()\n", values["out"]], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
            holder.stdout.readline()
            stack.callback(holder.wait, 30)
            stack.callback(holder.stdin.close)
        if "bad-config" in need:
            (tmp / "bad.toml").write_text('[evol_instruct]\nrounds = "many"\n')
        if need & {"url", "models-elsewhere", "model-404"}:
            srv = stack.enter_context(ScriptedServer())
            if "models-elsewhere" in need:
                srv.models = ["org/llama-3-8b", "org/qwen-7b"]
            if "model-404" in need:
                srv.unknown_models = {"smollm2-135m-instruct"}
            values["url"] = srv.base_url
        if "web" in need:
            web = ThreadingHTTPServer(("127.0.0.1", 0), _WebPage)
            threading.Thread(target=web.serve_forever, kwargs={"poll_interval": SERVE_POLL}, daemon=True).start()
            stack.callback(web.server_close)
            stack.callback(web.shutdown)
            values["web"] = f"http://127.0.0.1:{web.server_address[1]}/v1"
        if "busy" in need:
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", free_port()))
            sock.listen()
            values["busy"] = str(sock.getsockname()[1])
        if "port" in need:
            values["port"] = str(free_port())
        if "evolved" in need:
            from evolforge.testing.ppo_models import write_evolved

            values["evolved"] = str(write_evolved(tmp / "evolve" / "dataset" / "evolved.parquet", n_seeds=2))
        if "empty-reward" in need:
            (tmp / "empty-reward").mkdir()
        if "unhealthy-reward" in need:
            root = tmp / "unhealthy-reward"
            for name in ("irm", "prm"):
                (root / "models" / name).mkdir(parents=True)
                (root / "models" / name / "config.json").write_text("{}")
            (root / "health.json").write_text(json.dumps({"data": {"passed": True}, "model": {
                "passed": False, "problems": ["IRM overfit: mean over 0.9"]}}))
        if "pipeline" in need:
            values["pipeline"] = str(_pipeline_folder(tmp / "pipeline"))
        yield values


@contextlib.contextmanager
def tls_endpoint(tmp: Path) -> Iterator[tuple[str, Path]]:
    """An https OpenAI-style endpoint (GET /models) on loopback with a self-signed certificate for 127.0.0.1:
    (its base URL, the certificate file, which is its own CA bundle)."""
    import ssl
    import subprocess

    cert, key = tmp / "tls-cert.pem", tmp / "tls-key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)

    class Models(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"object": "list", "data": [{"id": "smollm2-135m-instruct"}]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Models)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": SERVE_POLL}, daemon=True).start()
    try:
        yield f"https://127.0.0.1:{srv.server_address[1]}/v1", cert
    finally:
        srv.shutdown()
        srv.server_close()


def _evolve_run(out: Path, seeds: str) -> Path:
    """An evolve run's folder as a first run leaves it once its seeds are imported: run.json and the round-1
    pool (what a resume is checked against), made without running anything."""
    from evolforge.config.settings import load_settings
    from evolforge.storage.layout import RunLayout
    from evolforge.storage.run_record import open_run

    lay = RunLayout(out).ensure()
    lay.start_marker("evolve")
    lay.round_input(1).parent.mkdir(parents=True, exist_ok=True)
    lay.round_input(1).write_bytes(b"")
    open_run(lay, seeds, load_settings(), "first-run").save()
    return out


def _pipeline_folder(root: Path) -> Path:
    """A pipeline run's folder: its marker, and an evolve and a synthesize stage folder with a ledger each."""
    from evolforge.storage.folder import StageFolder
    from evolforge.storage.ledger import LedgerWriter

    StageFolder(root).ensure().start_marker("pipeline")
    for stage in ("evolve", "synthesize"):
        folder = StageFolder(root / stage).ensure()
        folder.start_marker(stage)
        writer = LedgerWriter(folder.ledger_dir, "run-1")
        writer.record(stage=stage, model="m", task_id="t1", attempt=1, outcome="ok", prompt_tokens=10,
                      completion_tokens=5, cost_usd=0.001, latency_s=0.1)
        writer.close()
    return root
