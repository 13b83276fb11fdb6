"""Dedup whose per-record work runs on the workers (tasks/dedup/distributed.py): the same kept ids and dropped rows
as one process (tasks/dedup/pipeline.py dedup_file with the same settings), on the threads runner, a real local
Dask cluster (distributed.LocalCluster, two worker processes) and a real local Ray cluster (`ray start --head`);
a re-run reuses the steps whose completion marker exists; a SIGKILLed worker's shard is redone alone (slow)."""

from __future__ import annotations

import json
import os

import pytest

from evolforge.config.sections.dedup import DedupSettings
from evolforge.flows.dedup import DedupParams, dedup_flow
from evolforge.tasks.dedup import dedup_file
from evolforge.tasks.dedup.distributed import run_step, work_for
from evolforge.testing.dedup_decisions import SMALL, write_corpus
from evolforge.testing.dedup_decisions import assert_same as _same
from evolforge.testing.dedup_decisions import decisions as _decisions

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "in.jsonl")


@pytest.fixture(scope="module")
def one_process(corpus_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    dedup_file(corpus_file, "text", out, DedupSettings(**SMALL), id_field="id")
    return _decisions(out)


def _flow(corpus_file, out, runner, **dedup):
    return dedup_flow(DedupParams(input=str(corpus_file), text_field="text", id_field="id", out=str(out),
                                  overrides={"dedup": {**SMALL, **dedup}, "runner": runner}))


@pytest.mark.long("the module's first test pays its fixtures: the one-process reference dedup with the embedding "
                  "model loaded, then the flow on threads (4 to 15 s of CPU by load)")
def test_threads_runner_decides_as_one_process(corpus_file, one_process, tmp_path):
    summary = _flow(corpus_file, tmp_path / "out", {"kind": "threads", "max_workers": 2})
    _same(_decisions(tmp_path / "out"), one_process)
    stats = summary["stats"]
    assert all(stats[f"dropped_{m}"] > 0 for m in ("exact", "minhash", "embedding")), stats
    assert stats["embedding_confirm_checked"] > 0 and stats["steps_reused"] == []
    assert not os.path.exists(stats["work_dir"])  # removed once the outputs are written


def test_keep_best_decides_as_one_process(corpus_file, tmp_path):
    s = DedupSettings(**{**SMALL, "keep": "best", "score_field": "score"})
    dedup_file(corpus_file, "text", tmp_path / "one", s, id_field="id")
    _flow(corpus_file, tmp_path / "out", {"kind": "threads", "max_workers": 2}, keep="best",
          score_field="score")
    _same(_decisions(tmp_path / "out"), _decisions(tmp_path / "one"))


@pytest.mark.parametrize("runner", [{"kind": "threads", "max_workers": 2}, {"kind": "dask", "max_workers": 2}],
                         ids=["threads", "dask"])
def test_a_rerun_reuses_the_finished_steps(corpus_file, one_process, tmp_path, runner):
    """A run that stopped after the split and two of the three prep shards: the re-run does only the rest (on the
    threads runner and on a real local Dask cluster)."""
    if runner["kind"] == "dask":
        pytest.importorskip("prefect_dask")
    out = tmp_path / "out"
    s = DedupSettings(**SMALL)
    work = work_for(str(corpus_file), str(out), s)
    split = run_step("split", str(work.root), {"input": str(corpus_file), "text_field": "text", "id_field": "id"}, s)
    for k in (0, 2):
        run_step("prep", str(work.root), {"shard": k, "bounds": split["bounds"]}, s)
    summary = _flow(corpus_file, out, runner)
    assert summary["stats"]["steps_reused"] == ["split", "prep/shard-00000", "prep/shard-00002"]
    attempts = summary["stats"]["step_attempts"]
    assert len(attempts["prep/shard-00000"]) == 1 and len(attempts["prep/shard-00001"]) == 1
    _same(_decisions(out), one_process)


def test_dask_cluster_decides_as_one_process(corpus_file, one_process, tmp_path):
    pytest.importorskip("prefect_dask")
    summary = _flow(corpus_file, tmp_path / "out", {"kind": "dask", "max_workers": 2})
    _same(_decisions(tmp_path / "out"), one_process)
    workers = summary["stats"]["shard_workers"]
    assert len(workers) == 2 and str(os.getpid()) not in workers   # every step ran in the two worker processes


@pytest.mark.slow
def test_ray_cluster_decides_as_one_process(corpus_file, one_process, tmp_path):
    pytest.importorskip("prefect_ray")
    from evolforge.testing.ray_cluster import local_ray_cluster

    with local_ray_cluster(num_cpus=2, object_store_memory=200_000_000) as cluster:
        summary = _flow(corpus_file, tmp_path / "out", {"kind": "ray", "address": cluster.gcs_address})
    _same(_decisions(tmp_path / "out"), one_process)
    assert str(os.getpid()) not in summary["stats"]["shard_workers"]


@pytest.mark.slow
def test_a_worker_killed_mid_shard_has_that_shard_redone_alone(corpus_file, one_process, tmp_path):
    """SIGKILL the Dask worker process that took embed/shard-00001 (loading its static model or encoding): the
    step is taken again by another worker process, no other step runs twice, and the decisions are unchanged."""
    import signal
    import threading
    import time

    pytest.importorskip("prefect_dask")
    work_base = tmp_path / "work"
    killed: list[int] = []

    def kill_when_started() -> None:
        deadline = time.time() + 600
        while time.time() < deadline and not killed:
            for marker in work_base.glob("*/embed/shard-00001/started-*.json"):
                pid = json.loads(marker.read_text())["pid"]
                if not (marker.parent / "done.json").exists():
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                break
            time.sleep(0.01)

    watcher = threading.Thread(target=kill_when_started, daemon=True)
    watcher.start()
    summary = _flow(corpus_file, tmp_path / "out", {"kind": "dask", "max_workers": 2}, shard_dir=str(work_base))
    watcher.join(timeout=1)
    assert killed, "the worker was not caught mid-shard"
    _same(_decisions(tmp_path / "out"), one_process)
    attempts = summary["stats"]["step_attempts"]
    assert attempts["embed/shard-00001"][0] == killed[0] and len(attempts["embed/shard-00001"]) == 2
    assert killed[0] not in attempts["embed/shard-00001"][1:]
    assert all(len(pids) == 1 for step, pids in attempts.items() if step != "embed/shard-00001"), attempts


class _Inline:
    """A task runner that runs each submitted task here and now (the steps' own logic, without Prefect)."""

    class _Done:
        def __init__(self, value):
            self.value = value

        def result(self):
            return self.value

    def submit(self, task, parameters):
        return self._Done(task.fn(**parameters))


@pytest.mark.parametrize("shards,keep,step_tasks,methods", [
    pytest.param(2, "earliest", 16, {}, marks=pytest.mark.slow), (5, "best", 16, {}), (8, "earliest", 3, {}),
    pytest.param(3, "earliest", 16, {"exact": False, "minhash": False}, marks=pytest.mark.slow),
    pytest.param(3, "best", 16, {"embedding": False}, marks=pytest.mark.slow)])
def test_every_shard_count_decides_as_one_process(corpus_file, tmp_path, shards, keep, step_tasks, methods):
    """The driver's step plan (flows/dedup.py on_workers) run inline: buckets, component rounds and group shards
    give one process's decisions at shard counts that do not divide the records evenly, for both keep rules."""
    import logging

    from evolforge.flows.dedup import on_workers
    from evolforge.testing.settings import make_settings

    dedup = {**SMALL, "shards": shards, "keep": keep, "score_field": "score", "step_tasks": step_tasks,
             "shard_dir": str(tmp_path / "work"), **methods}
    dedup_file(corpus_file, "text", tmp_path / "one", DedupSettings(**dedup), id_field="id")
    settings = make_settings(dedup=dedup)
    p = DedupParams(input=str(corpus_file), text_field="text", id_field="id", out=str(tmp_path / "out"))
    summary = on_workers(_Inline(), p, settings, settings.model_dump_json(), logging.getLogger("test"))
    _same(_decisions(tmp_path / "out"), _decisions(tmp_path / "one"))
    st = summary["stats"]
    for m in ("minhash", "embedding"):
        assert (st.get(f"{m}_component_rounds", 0) >= 1) == methods.get(m, True), st
    # no file count grows with the records: a fixed number per shard and step
    assert max(st["work_files"].values()) <= 40 * shards, st["work_files"]
    if step_tasks < shards:   # several shards per Prefect task: fewer tasks than steps
        assert st["prefect_tasks"] < st["steps"] / 2, (st["prefect_tasks"], st["steps"])
