"""The test harness's Prefect database starts from a migrated copy kept in the cache (testing/prefect_server.py)."""

from __future__ import annotations

import contextlib
import sqlite3

from evolforge.testing.prefect_server import _template_path


def test_the_harness_leaves_a_migrated_copy_with_no_run_in_it(prefect_harness):
    template = _template_path()
    assert template.is_file()
    with contextlib.closing(sqlite3.connect(f"file:{template}?immutable=1", uri=True)) as db:
        assert db.execute("pragma journal_mode").fetchone()[0] == "delete"  # the copy is one whole file
        assert db.execute("select count(*) from alembic_version").fetchone()[0] == 1
        assert db.execute("select count(*) from flow_run").fetchone()[0] == 0
