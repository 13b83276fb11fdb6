"""Checkpoints and outputs on an object store: a real S3 API (moto's server, its own process, on loopback).

The evolve flow writes its whole output folder to s3://, resumes from it, and
`evolforge retry` reopens failed batches there; storage/fs.py's primitives are
checked on s3:// and memory://.
"""

from __future__ import annotations

import io
import json
import threading
import time

import fsspec
import polars as pl
import pyarrow as pa
import pytest

from evolforge.cli import main as cli_main
from evolforge.flows.evolve import EvolveParams, evolve_flow
from evolforge.storage import fs as store
from evolforge.storage import logs
from evolforge.storage.journal import CallJournal
from evolforge.storage.layout import RunLayout
from evolforge.storage.ledger import LedgerWriter, read_ledger
from evolforge.storage.parts import read_part, write_table_atomic
from evolforge.testing.lazy import lazy_module, needs
from evolforge.testing.net import SERVE_POLL
from evolforge.testing.s3_server import moto_s3

s3fs = lazy_module("s3fs")  # imported by the tests that use it, not at collection
pytestmark = needs("s3fs")


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server process; fsspec's s3 config points at it (as FSSPEC_S3 would)."""
    with moto_s3("evolforge"):
        yield fsspec.filesystem("s3")


@pytest.mark.parametrize("root", ["memory://evolforge-unit", "s3://evolforge/unit"])
def test_storage_primitives_on_remote_filesystems(root, request):
    if root.startswith("s3"):
        request.getfixturevalue("s3")
    base = store.location(root)
    assert store.is_remote(base)
    # atomic output: an error inside the block publishes nothing and leaves no temporary object
    target = base / "atomic" / "a.parquet"
    with pytest.raises(RuntimeError):
        with store.atomic_output(target) as fh:
            fh.write(b"half a file")
            raise RuntimeError("killed mid-write")
    assert not store.exists(target)
    assert not base.fs.glob(f"{(base / 'atomic').path}/*")
    table = pa.table({"id": ["a", "b", "c"], "n": [1, 2, 3]})
    write_table_atomic(table, target, row_group_size=2)
    assert read_part(target).to_pydict()["id"] == ["a", "b", "c"]
    assert store.parquet_file(target).num_row_groups == 2
    assert store.scan_parquet([target]).collect()["n"].sum() == 6
    # append-only logs: one object per entry, read back in order, across writers
    log = base / "journal" / "batch_00000.jsonl"
    j = CallJournal(log)
    j.put("k1", {"v": 1})
    j.put("k2", {"v": 2})
    j.close()
    assert len(CallJournal(log)) == 2 and CallJournal(log).get("k2") == {"v": 2}
    w1, w2 = LedgerWriter(base / "ledger", "run"), LedgerWriter(base / "ledger", "run", flush_seconds=0)
    for w in (w1, w2, w1):
        w.record(stage="evolve", task_id="t", outcome="ok")
    assert read_ledger(base).height == 1  # w2 writes row by row; w1 buffers its rows for up to a second
    w1.flush()
    assert read_ledger(base).height == 3 and w1._log.objects_written == 1  # w1's two rows: one object
    assert len(logs.list_logs(base / "ledger")) == 2
    w3 = LedgerWriter(base / "ledger", "run", flush_seconds=0.2)
    w3.record(stage="evolve", task_id="t", outcome="ok")
    deadline = time.time() + 10
    while read_ledger(base).height < 4:  # the flush timer publishes it without a close
        assert time.time() < deadline, "buffered ledger row never flushed"
        time.sleep(0.05)
    # rename and text
    store.write_text_atomic(base / "x.json", '{"a": 1}')
    store.replace(base / "x.json", base / "y.json")
    assert not store.exists(base / "x.json") and json.loads(store.read_text(base / "y.json")) == {"a": 1}


def test_a_missing_filesystem_package_is_a_clear_error():
    with pytest.raises(store.StorageURLError, match="fsspec package"):
        store.location("nosuchproto://bucket/run")


# ---------------------------------------------------------------- an S3 endpoint that refuses PUTs
class RefusingProxy:
    """A loopback HTTP proxy in front of moto's server: every request is forwarded, except the PUTs of log objects
    (keys containing `pattern`) it is told to refuse, which get S3's 503 ServiceUnavailable.

    A real S3 API path (s3fs -> aiobotocore -> HTTP -> moto) with faults, which moto itself cannot inject:
    while `down`, every matching PUT is refused; while `land_then_fail`, it is forwarded and answered 503 anyway
    (the object was written, the client sees a failure); with `outage_seconds`, the first matching PUT starts
    an outage of that length. Switches and time rather than counts: how many HTTP PUTs one `pipe_file` sends
    is the client stack's business (s3fs and botocore retry on their own).
    """

    def __init__(self, upstream: str, pattern: str = ".jsonl.d/"):
        import http.server
        import threading
        from urllib.parse import urlsplit

        up = urlsplit(upstream)
        self.upstream = (up.hostname, up.port)
        self.pattern = pattern
        self.down = False
        self.land_then_fail = False
        self.outage_seconds = 0.0
        self._outage_until: float | None = None
        self.refused: list[str] = []   # paths of the PUTs answered 503
        self.landed: list[str] = []    # paths of the PUTs forwarded (and answered by moto or by 503)
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        chunk = self.rfile.read(size + 2)[:size]
                        if not size:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return out
                        out += chunk
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _relay(self):
                import http.client

                body = self._body()
                verdict = proxy._verdict(self.command, self.path)
                if verdict == "refuse":
                    return self._unavailable()
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("connection", "keep-alive", "transfer-encoding", "content-length")}
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=30)
                try:
                    conn.request(self.command, self.path, body=body if body or self.command in ("PUT", "POST") else None,
                                 headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    if verdict == "land_then_fail":
                        return self._unavailable()
                    self.send_response(resp.status, resp.reason)
                    for k, v in resp.getheaders():
                        if k.lower() not in ("connection", "keep-alive", "transfer-encoding", "content-length"):
                            self.send_header(k, v)
                    length = resp.getheader("Content-Length") if self.command == "HEAD" else str(len(data))
                    self.send_header("Content-Length", length or "0")
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    conn.close()

            def _unavailable(self):
                data = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ServiceUnavailable</Code>'
                        b"<Message>Service unavailable: refused by the test proxy</Message>"
                        b"<RequestId>proxy</RequestId></Error>")
                self.send_response(503, "Service Unavailable")
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _relay

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": SERVE_POLL}, daemon=True)
        self._thread.start()

    def _verdict(self, method: str, path: str) -> str:
        if method != "PUT" or self.pattern not in path:
            return "forward"
        with self._lock:
            if self.outage_seconds and self._outage_until is None:
                self._outage_until = time.time() + self.outage_seconds
            if self.down or (self._outage_until is not None and time.time() < self._outage_until):
                self.refused.append(path)
                return "refuse"
            self.landed.append(path)
            return "land_then_fail" if self.land_then_fail else "forward"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def flaky_s3(s3, monkeypatch):
    """The s3 filesystem pointed at a RefusingProxy in front of moto (botocore's own retries off, so every
    refused PUT reaches evolforge); AppendLog retries with short backoff."""
    saved = dict(fsspec.config.conf["s3"])
    proxy = RefusingProxy(saved["endpoint_url"])
    fsspec.config.conf["s3"] = {**saved, "endpoint_url": proxy.url,
                                "config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"}}}
    s3fs.S3FileSystem.clear_instance_cache()
    monkeypatch.setattr(logs.AppendLog, "put_backoff_seconds", 0.01)
    try:
        yield proxy
    finally:
        fsspec.config.conf["s3"] = saved
        s3fs.S3FileSystem.clear_instance_cache()
        proxy.close()


def _lines(log_url) -> list[bytes]:
    return list(logs.read_log_lines([store.location(log_url)]))


def test_refused_log_puts_keep_their_entries_which_arrive_once_under_their_own_name(flaky_s3):
    url = "s3://evolforge/flaky/refused/batch_00000.jsonl"
    log = logs.AppendLog(store.location(url), flush_seconds=60)
    log.write(b'{"n": 1}\n')
    log.write(b'{"n": 2}\n')
    flaky_s3.down = True
    with pytest.raises(logs.LogFlushError, match=r"log s3://evolforge/flaky/refused/batch_00000\.jsonl: 2 entries "
                                                  r"could not be written .*3 attempts; last: OSError.*Service unavailable"):
        log.flush()
    assert log.failed_puts == log.put_attempts and _lines(url) == []
    assert len(set(flaky_s3.refused)) == 1  # every attempt: the same object name
    assert log.pending_lines() == [b'{"n": 1}\n', b'{"n": 2}\n']  # kept, in order
    log.write(b'{"n": 3}\n')
    flaky_s3.down = False
    log.flush()  # the kept entries go first, under their object name, then the new one
    assert _lines(url) == [b'{"n": 1}\n', b'{"n": 2}\n', b'{"n": 3}\n']
    assert flaky_s3.landed[0] == flaky_s3.refused[0] and len(set(flaky_s3.landed)) == 2
    assert log.pending_lines() == [] and log.objects_written == 2
    log.close()


def test_a_put_that_landed_but_reported_a_failure_is_overwritten_not_duplicated(flaky_s3):
    url = "s3://evolforge/flaky/landed/ledger.jsonl"
    log = logs.AppendLog(store.location(url), flush_seconds=60)
    flaky_s3.land_then_fail = True  # moto stores every object, the client is told 503
    log.write(b'{"row": 1}\n')
    log.write(b'{"row": 2}\n')
    with pytest.raises(logs.LogFlushError, match="ledger.jsonl: 2 entries"):
        log.flush()
    assert _lines(url) == [b'{"row": 1}\n', b'{"row": 2}\n']  # they did land
    flaky_s3.land_then_fail = False
    log.write(b'{"row": 3}\n')
    log.close()  # sent again under the same name: overwritten, not a second copy
    assert _lines(url) == [b'{"row": 1}\n', b'{"row": 2}\n', b'{"row": 3}\n']
    assert len(set(flaky_s3.landed)) == 2


def test_the_flush_timers_failure_is_raised_by_the_next_write(flaky_s3):
    url = "s3://evolforge/flaky/timer/batch_00001.jsonl"
    log = logs.AppendLog(store.location(url), flush_seconds=0.05)
    flaky_s3.down = True
    log.write(b'{"k": "a"}\n')
    deadline = time.time() + 20
    while log._error is None:  # the timer thread's flush exhausted its attempts
        assert time.time() < deadline, "the flush timer never tried"
        time.sleep(0.02)
    with pytest.raises(logs.LogFlushError, match="timer/batch_00001.jsonl: 1 entries could not be written"):
        log.write(b'{"k": "b"}\n')
    assert log.pending_lines() == [b'{"k": "a"}\n', b'{"k": "b"}\n']  # the entry that raised is kept too
    flaky_s3.down = False
    log.close()
    assert _lines(url) == [b'{"k": "a"}\n', b'{"k": "b"}\n']


def test_a_store_refusing_the_journal_fails_the_batch_visibly_and_the_retry_loses_nothing(flaky_s3, tmp_path):
    from evolforge.flows._fanout import retry_transient
    from evolforge.tasks.core.batch import BatchSpec, close_gateways, is_fatal, run_batch
    from evolforge.testing.settings import make_settings

    journal_url = "s3://evolforge/flaky/batch/journal/batch_00000.jsonl"
    part = tmp_path / "parts" / "batch_00000.parquet"
    computed: list[str] = []

    def work(row, gw, journal):
        key = f"call-{row['id']}"
        if journal.get(key) is None:
            computed.append(row["id"])  # stands for a model call
            journal.put(key, {"text": row["id"].upper()})
        return {"id": row["id"], "status": "ok", "error": None}

    spec = BatchSpec(name="flaky", part=part, journal=store.location(journal_url),
                     schema=pa.schema([("id", pa.string()), ("status", pa.string()), ("error", pa.string())]),
                     load_rows=lambda: [{"id": r} for r in "abcd"], work=work,
                     on_rejected=lambda row, err: {"id": row["id"], "status": "error", "error": str(err)},
                     concurrency=2)
    settings = make_settings("http://127.0.0.1:9/v1", storage={"remote_log_flush_seconds": 30})
    flaky_s3.down = True
    with pytest.raises(logs.LogFlushError, match="journal/batch_00000.jsonl: 4 entries could not be written") as e:
        run_batch(spec, settings, "http://127.0.0.1:9/v1", "flaky-run", tmp_path)
    assert not part.exists() and sorted(computed) == list("abcd")
    # transient, not fatal: the batch task's retry policy retries it
    state = type("State", (), {"result": lambda self: (_ for _ in ()).throw(e.value)})()
    assert not is_fatal(e.value) and retry_transient(None, None, state)

    flaky_s3.down = False  # the store recovers; the retried batch (same process) replays every call
    stats = run_batch(spec, settings, "http://127.0.0.1:9/v1", "flaky-run", tmp_path)
    assert stats["rows"] == 4 and sorted(computed) == list("abcd")
    lines = [json.loads(x) for x in _lines(journal_url)]
    assert sorted(x["key"] for x in lines) == ["call-a", "call-b", "call-c", "call-d"]  # each once
    close_gateways("flaky-run")




def _seeds(tmp_path, n=6):
    p = tmp_path / "seeds.jsonl"
    p.write_text("\n".join(json.dumps({"id": f"s{i}", "instruction": f"Plan a trip to city number {i}, day {i * 3}."})
                           for i in range(n)) + "\n")
    return p


def _params(tmp_path, server, out, rounds=2, dedup=False):
    return EvolveParams(seeds=str(_seeds(tmp_path)), out=out, rounds=rounds, base_url=server.base_url, overrides={
        "evol_instruct": {"batch_size": 2, "concurrency": 2, "dedup_each_round": dedup},
        "gateway": {"backoff_base_seconds": 0.0, "backoff_max_seconds": 0.0, "timeout_seconds": 2.0}})


def _s3_table(fs, key: str) -> pl.DataFrame:
    return pl.read_parquet(io.BytesIO(fs.cat_file(key)))


@pytest.mark.usefixtures("prefect_harness")
def test_a_batch_whose_journal_the_store_refuses_is_retried_by_prefect_and_sends_nothing_twice(tmp_path, server,
                                                                                               flaky_s3):
    url = "s3://evolforge/flaky/flow"
    flaky_s3.pattern = "round_01/journal/batch_00001.jsonl.d/"
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        TaskRunFilter,
        TaskRunFilterName,
        TaskRunFilterState,
        TaskRunFilterStateName,
    )

    batch = "evolve-round-1-batch-00001"
    # the store refuses the batch's journal until Prefect has that batch waiting for its retry (a condition, not
    # a clock): the first attempt fails however long it runs, and the retry, 1 s later, gets through
    flaky_s3.down = True
    done = threading.Event()

    def reopen_when_the_batch_awaits_its_retry():
        with get_client(sync_client=True) as client:
            while not done.is_set():
                if client.read_task_runs(task_run_filter=TaskRunFilter(
                        name=TaskRunFilterName(any_=[batch]),
                        state=TaskRunFilterState(name=TaskRunFilterStateName(any_=["AwaitingRetry"])))):
                    flaky_s3.down = False
                    return
                done.wait(0.05)

    watcher = threading.Thread(target=reopen_when_the_batch_awaits_its_retry, daemon=True)
    watcher.start()
    params = _params(tmp_path, server, url, rounds=1)
    params.overrides["runner"] = {"retry_delay_seconds": 1.0}
    try:
        summary = evolve_flow(params)
    finally:
        done.set()
        watcher.join(10)
    assert flaky_s3.refused and not flaky_s3.down and summary["counts"]["lineage"] == 6
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[summary["run_id"]])),
            task_run_filter=TaskRunFilter(name=TaskRunFilterName(any_=[batch])))
    assert len(runs) == 1 and runs[0].state_name == "Completed"
    assert runs[0].run_count >= 2  # failed (LogFlushError), then retried by the batch task's retry policy
    assert len(server.posts()) == 6 * 3  # the retried batch replayed its calls from the kept journal entries
    keys = [json.loads(x)["key"] for x in _lines(f"{url}/rounds/round_01/journal/batch_00001.jsonl")]
    assert len(keys) == len(set(keys)) == 2 * 3


@pytest.mark.usefixtures("prefect_harness")
def test_evolve_run_lives_on_s3_resumes_and_matches_a_local_run(tmp_path, server, s3):
    url = "s3://evolforge/nightly/run-a"
    summary = evolve_flow(_params(tmp_path, server, url))
    assert summary["out_dir"] == url
    calls = len(server.posts())
    assert calls == 6 * 3 * 2
    for key in ("run.json", "summary.json", "dataset/evolved.parquet", "dataset/lineage.parquet",
                "dataset/final_pool.parquet", "cost_ledger.parquet", "rejects.jsonl", "rounds/round_02/_SUCCESS",
                "rounds/round_01/parts/batch_00002.parquet", "dataset/sft/train.parquet", "dataset/README.md",
                "plots/survival_by_operation.png", "plots/eliminations_by_rule.png", "plots/cost_tokens_by_stage.png"):
        assert s3.exists(f"evolforge/nightly/run-a/{key}"), key
    assert summary["card"] == f"{url}/dataset/README.md" and len(summary["plots"]) == 3  # written, not warned away
    assert not s3.glob("evolforge/nightly/run-a/**/*.tmp")
    lineage = _s3_table(s3, "evolforge/nightly/run-a/dataset/lineage.parquet")
    assert lineage.height == 12 and lineage["id"].n_unique() == 12
    assert read_ledger(url).height == calls + 1  # one ledger object per call, all read back (+ the pre-flight)
    # the same run on a local folder gives the same dataset
    local = evolve_flow(_params(tmp_path, server, str(tmp_path / "local")))
    local_lineage = pl.read_parquet(RunLayout(local["out_dir"]).lineage)
    cols = ["id", "parent_id", "status", "instruction"]
    assert lineage.select(cols).sort("id").equals(local_lineage.select(cols).sort("id"))
    # running again over the URL resumes: nothing is sent again
    before = len(server.posts())
    again = evolve_flow(_params(tmp_path, server, url))
    assert len(server.posts()) == before and again["counts"] == summary["counts"]


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.long("a flow run whose batches fail on S3 and are retried from their checkpoints: 8-10 s of CPU")
def test_failed_batches_are_retried_from_s3_checkpoints(tmp_path, server, s3):
    url = "s3://evolforge/nightly/run-b"
    server.script("400", "400")  # two records' first call is rejected: their batch holds status=error
    evolve_flow(_params(tmp_path, server, url, rounds=1))
    lineage = _s3_table(s3, "evolforge/nightly/run-b/dataset/lineage.parquet")
    assert lineage.filter(pl.col("status") == "error").height == 2
    sent = len(server.posts())
    assert cli_main(["retry", "--out", url, "--base-url", server.base_url]) == 0
    lineage = _s3_table(s3, "evolforge/nightly/run-b/dataset/lineage.parquet")
    assert lineage.height == 6 and set(lineage["status"]) == {"accepted"}
    assert len(server.posts()) - sent == 6  # only the two failed records (3 calls each); the rest replayed
    assert s3.glob("evolforge/nightly/run-b/rounds/round_01/parts/*.retry-*")


@pytest.mark.usefixtures("prefect_harness")
def test_dedup_index_and_nightly_dataset_on_s3(tmp_path, server, s3):
    from evolforge.flows.nightly import NightlyParams, nightly_flow

    common = dict(dataset="s3://evolforge/datasets/instruct", seeds=str(_seeds(tmp_path)), rounds_per_night=1,
                  base_url=server.base_url,
                  overrides={"evol_instruct": {"batch_size": 3, "concurrency": 2},
                             "gateway": {"backoff_base_seconds": 0.0, "timeout_seconds": 2.0}})
    first = nightly_flow(NightlyParams(night="2026-11-01", **common))
    second = nightly_flow(NightlyParams(night="2026-11-02", **common))
    assert first["previous"] is None and second["previous"] == "2026-11-01"
    assert second["total_rounds"] == 2
    root = "evolforge/datasets/instruct"
    assert json.loads(s3.cat_file(f"{root}/nights.json"))[-1]["night"] == "2026-11-02"
    manifest = json.loads(s3.cat_file(f"{root}/dedup_index/manifest.json"))
    assert manifest["count"] >= 6 and all(s3.exists(f"{root}/dedup_index/{seg}") for seg in manifest["segments"])
    night2 = _s3_table(s3, f"{root}/nights/2026-11-02/dataset/lineage.parquet")
    night1_pool = _s3_table(s3, f"{root}/nights/2026-11-01/dataset/final_pool.parquet")
    assert set(night2["parent_id"]) == set(night1_pool["id"])  # night 2 evolved night 1's survivors


@pytest.mark.usefixtures("prefect_harness")
def test_dask_workers_share_an_s3_output_folder_configured_from_the_environment(tmp_path, server, s3, monkeypatch):
    """The documented set-up: credentials and endpoint in the environment, batches on two Dask worker processes."""
    pytest.importorskip("prefect_dask")
    conf = fsspec.config.conf["s3"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("FSSPEC_S3", json.dumps({"endpoint_url": conf["endpoint_url"],
                                                "client_kwargs": {"region_name": "us-east-1"}}))
    url = "s3://evolforge/scale-out/run"
    p = _params(tmp_path, server, url)
    p.overrides["runner"] = {"kind": "dask", "max_workers": 2}
    evolve_flow(p)
    lineage = _s3_table(s3, "evolforge/scale-out/run/dataset/lineage.parquet")
    assert lineage.height == 12 and lineage["id"].n_unique() == 12
    # batches ran in two worker processes, each writing its own ledger objects to the bucket
    writers = {key.split("/")[-2] for key in s3.glob("evolforge/scale-out/run/ledger/*.jsonl.d/*.jsonl")}
    assert len({w.split(".")[1] for w in writers}) >= 2
    assert read_ledger(url).filter(pl.col("stage") != "preflight").height == 12 * 3


@pytest.mark.usefixtures("prefect_harness")
def test_reward_data_and_trained_models_on_s3_feed_the_ppo_stage(tmp_path, server, s3):
    """reward-data reads an evolve run on s3:// and writes there; train-reward publishes models there
    (meta file last); the PPO stage downloads them and scores with them."""
    from evolforge.flows.ppo import PPOParams
    from evolforge.flows.reward_data import RewardDataParams, reward_data_flow
    from evolforge.flows.train_reward import TrainRewardParams, train_reward_flow
    from evolforge.storage.reward_sets import META_FILE, RewardLayout
    from evolforge.tasks.ppo.job import resolve
    from evolforge.tasks.reward.scoring import score_instructions
    from evolforge.testing.evolved_runs import TINY_TRAINING, evolve_folder

    local_evolve = evolve_folder(tmp_path)
    s3.put_file(str(local_evolve / "dataset" / "evolved.parquet"), "evolforge/rm/evolve/dataset/evolved.parquet")
    data_url, reward_url = "s3://evolforge/rm/evolve", "s3://evolforge/rm/reward"
    summary = reward_data_flow(RewardDataParams(
        evolve_out=data_url, out=reward_url, base_url=server.base_url,
        overrides={"reward": {"batch_size": 4, "concurrency": 2},
                   "gateway": {"backoff_base_seconds": 0.0, "timeout_seconds": 2.0}}))
    assert summary["irm"]["pairs"] == _s3_table(s3, "evolforge/rm/reward/data/train-00000-of-00001.parquet").height == 36
    n = len(server.posts())
    reward_data_flow(RewardDataParams(evolve_out=data_url, out=reward_url, base_url=server.base_url,
                                      overrides={"reward": {"batch_size": 4, "concurrency": 2}}))
    assert len(server.posts()) == n  # resumed from the parts on s3: nothing sent again

    metrics = train_reward_flow(TrainRewardParams(data=reward_url, overrides={"reward": TINY_TRAINING}))
    assert metrics["models"]["irm"]["train_pairs"] + metrics["models"]["irm"]["eval_pairs"] == 36
    for kind in ("irm", "prm"):
        keys = {k.rsplit("/", 1)[-1] for k in s3.find(f"evolforge/rm/reward/models/{kind}")}
        assert {META_FILE, "config.json"} <= keys
    health = json.loads(s3.cat_file("evolforge/rm/reward/health.json"))
    assert health["model"]["irm"]["n"] > 0
    assert RewardLayout(reward_url).model_ready("irm")

    # the PPO stage takes the reward folder as a URL: models arrive as local folders that score
    _, evolved, irm, prm = resolve(PPOParams(evolved=data_url, reward_dir=reward_url, out=str(tmp_path / "ppo")))
    assert str(evolved) == f"{data_url}/dataset/evolved.parquet"
    assert (irm / META_FILE).exists() and (prm / "config.json").exists()
    scores = score_instructions(irm, ["Add 1 and 1.", "Write a haiku about rain in June."])
    assert len(scores) == 2 and all(0.0 < s < 1.0 for s in scores)
    with pytest.raises(ValueError, match="must be a local"):
        from evolforge.storage.ppo import PPOLayout

        PPOLayout("s3://evolforge/rm/ppo")
