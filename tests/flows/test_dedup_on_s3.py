"""The dedup on the workers with its work folder on an object store (`dedup.shard_dir` = s3://...): a real S3 API
(moto's server on loopback). Every step is run as if on a machine of its own (an empty local mirror each time),
so every file a step reads came through the store; and on a real local Dask cluster whose worker processes get
the store from the environment, as a user's would. Both decide as one process."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from evolforge.config.sections.dedup import DedupSettings
from evolforge.flows.dedup import DedupParams, dedup_flow, on_workers
from evolforge.storage.dedup_work import DedupWork
from evolforge.tasks.dedup import dedup_file
from evolforge.tasks.dedup.distributed import run_step, work_for
from evolforge.testing.dedup_decisions import SMALL, assert_same, decisions, write_corpus
from evolforge.testing.lazy import needs
from evolforge.testing.settings import make_settings

pytestmark = [pytest.mark.usefixtures("prefect_harness"), needs("s3fs")]
MIRRORS = Path(tempfile.gettempdir()) / "evolforge-dedup-mirror"


@pytest.fixture(scope="module")
def s3():
    from evolforge.testing.s3_server import moto_s3

    with moto_s3("evolforge", environment=True):
        import fsspec

        yield fsspec.filesystem("s3")


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "in.jsonl", n=900, seed=11)


@pytest.fixture(scope="module")
def corpus(corpus_file, tmp_path_factory):
    """The corpus and one process's decisions on it (a whole dedup with its embedding model)."""
    path = corpus_file
    out = tmp_path_factory.mktemp("one")
    dedup_file(path, "text", out, DedupSettings(**SMALL), id_field="id")
    return path, decisions(out)


class _EachStepOnANewMachine:
    """Runs each submitted task here and now, after emptying this machine's mirrors: no file written by an
    earlier step is found locally, so each one is read from the store."""

    class _Done:
        def __init__(self, value):
            self.value = value

        def result(self):
            return self.value

    def __init__(self):
        self.tasks = 0

    def submit(self, task, parameters):
        shutil.rmtree(MIRRORS, ignore_errors=True)
        self.tasks += 1
        value = task.fn(**parameters)
        return self._Done(value)


def test_steps_on_separate_machines_exchange_everything_through_the_store(corpus, s3, tmp_path):
    path, want = corpus
    dedup = {**SMALL, "shard_dir": "s3://evolforge/dedup-work"}
    settings = make_settings(dedup=dedup)
    p = DedupParams(input=str(path), text_field="text", id_field="id", out=str(tmp_path / "out"))
    runner = _EachStepOnANewMachine()
    summary = on_workers(runner, p, settings, settings.model_dump_json(), logging.getLogger("test"))
    assert_same(decisions(tmp_path / "out"), want)
    st = summary["stats"]
    assert st["work_dir"].startswith("s3://evolforge/dedup-work/") and runner.tasks == st["prefect_tasks"]
    # the store held every step's files and markers (counted on the store before they were removed)
    assert st["work_files"]["records"] >= 3 and st["work_bytes"] > 100_000, st["work_files"]
    assert sum(n for top, n in st["work_files"].items() if top.startswith("embedding")) > 0
    assert not s3.exists(st["work_dir"])   # removed once the outputs were written


def test_a_marker_only_counts_once_it_is_on_the_store(corpus_file, s3):
    """A step whose files and marker reached a machine's mirror but not the store (its worker was killed between
    the two) is not taken as done: markers are read from the store."""
    path = corpus_file
    s = DedupSettings(**{**SMALL, "shard_dir": "s3://evolforge/marker-check"})
    work = work_for(str(path), "out", s)
    assert work.location.startswith("s3://") and MIRRORS in work.root.parents
    run_step("split", work.location, {"input": str(path), "text_field": "text", "id_field": "id"}, s)
    assert DedupWork(work.location).done("split")["n"] == 900
    key = work.location[len("s3://"):] + "/split/done.json"
    assert s3.exists(key)
    s3.rm(key)
    assert (work.root / "split" / "done.json").exists()   # the mirror still has it
    assert DedupWork(work.location).done("split") is None
    again = run_step("split", work.location, {"input": str(path), "text_field": "text", "id_field": "id"}, s)
    assert "reused" not in again and s3.exists(key)
    assert DedupWork(work.location).attempts("split") == [os.getpid()]   # listed on the store
    work.remove()
    assert not s3.exists(work.location) and not work.root.exists()


@pytest.mark.slow
def test_dask_workers_share_an_s3_work_folder_configured_from_the_environment(corpus, s3, tmp_path):
    pytest.importorskip("prefect_dask")
    path, want = corpus
    summary = dedup_flow(DedupParams(input=str(path), text_field="text", id_field="id", out=str(tmp_path / "out"),
                                     overrides={"dedup": {**SMALL, "shard_dir": "s3://evolforge/dask-work"},
                                                "runner": {"kind": "dask", "max_workers": 2}}))
    assert_same(decisions(tmp_path / "out"), want)
    assert len(summary["stats"]["shard_workers"]) == 2 and summary["stats"]["work_files"]["prep"] >= 3
    assert not s3.exists("evolforge/dask-work") or not s3.find("evolforge/dask-work")


def test_a_dedup_against_an_index_exchanges_the_index_through_the_store_too(corpus, s3, tmp_path):
    """With a persistent index the dedup on the workers is the same plan: its `history` step puts the indexed
    records into the work folder and its `index` step appends the kept ones. With the work folder on the store and
    every step run as on a machine of its own, the decisions and the extended index are those of one process."""
    import json

    from evolforge.tasks.dedup.index import DedupIndex
    from evolforge.tasks.dedup.pipeline import _encoder

    path, _ = corpus
    first = tmp_path / "first.jsonl"
    first.write_text("".join(path.read_text().splitlines(True)[:300]))   # indexed first: exact drops against it
    for idx in ("idx", "idx-one"):
        dedup_file(first, "text", tmp_path / f"first-{idx}", DedupSettings(**SMALL), id_field="id",
                   index_dir=tmp_path / idx)
    dedup = {**SMALL, "shard_dir": "s3://evolforge/index-work"}
    settings = make_settings(dedup=dedup)
    p = DedupParams(input=str(path), text_field="text", id_field="id", out=str(tmp_path / "out"),
                    index=str(tmp_path / "idx"))
    summary = on_workers(_EachStepOnANewMachine(), p, settings, settings.model_dump_json(), logging.getLogger("test"))
    dedup_file(path, "text", tmp_path / "one", DedupSettings(**SMALL), id_field="id", index_dir=tmp_path / "idx-one")
    assert_same(decisions(tmp_path / "out"), decisions(tmp_path / "one"))
    st = summary["stats"]
    assert st["indexed_before"] > 0 and st["dropped_exact"] > 0 and st["work_files"]["history"] > 0
    s = DedupSettings(**SMALL)
    ids = [DedupIndex(tmp_path / idx, s, _encoder("static", s).fingerprint).load().ids for idx in ("idx", "idx-one")]
    assert ids[0] == ids[1] and len(ids[0]) > st["indexed_before"]
    assert json.loads((tmp_path / "idx" / "manifest.json").read_text())["count"] == len(ids[0])
    assert not s3.find("evolforge/index-work")   # the work folder removed once the outputs were written
