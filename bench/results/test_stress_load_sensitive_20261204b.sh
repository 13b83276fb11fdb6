#!/usr/bin/env bash
# 30 runs in a row of the quick tier's load-sensitive tests beside `stress-ng --cpu 2` (two busy processes on a
# 2-core machine), run from a fresh clone after `make setup`: bash THIS_FILE CLONE_DIR > OUT.txt
cd "${1:?clone dir}"
N=${N:-30}
SEL=(
 "tests/tasks/sandbox/test_sandbox.py::test_run_many_in_parallel_keeps_order"
 "tests/tasks/sandbox/test_sandbox.py::test_fork_bomb_hits_the_process_limit"
 "tests/tasks/sandbox/test_sandbox_pool.py::test_processes_of_an_earlier_check_are_gone"
 "tests/tasks/sandbox/test_sandbox_pool.py::test_output_flood_retires_the_worker_and_the_next_check_is_clean"
 "tests/tasks/sandbox/test_sandbox_pool.py::test_worker_is_replaced_after_max_checks_and_after_a_timeout"
 "tests/tasks/sandbox/test_sandbox_uids.py"
 "tests/tasks/ppo/test_ray_jobs.py::test_other_refusals_and_an_agent_that_never_comes_fail"
 "tests/tasks/proxy/test_proxy_boundaries.py::test_ctrl_c_stops_the_proxy_cleanly_with_every_record_written"
 "tests/tasks/proxy/test_proxy_translate.py::test_a_client_that_goes_away_mid_stream_stops_the_upstream_call_and_is_one_record"
 "tests/tasks/proxy/test_proxy.py::test_a_client_leaving_mid_stream_is_recorded_and_the_proxy_keeps_serving"
 "tests/tasks/core/test_rate_limit.py"
 "tests/cli/test_fail_fast.py"
)
echo "tree $(git rev-parse --short HEAD); stress-ng --cpu 2"
stress-ng --cpu 2 --timeout 0 >/dev/null 2>&1 &
hog=$!
trap 'kill $hog 2>/dev/null' EXIT
for i in $(seq 1 $N); do
  echo "== run $i $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  PYTHONDONTWRITEBYTECODE= .venv/bin/python -m pytest -q -n 0 -p no:randomly -p no:cacheprovider "${SEL[@]}" 2>&1 \
    | grep -E "passed|failed|^FAILED|^ERROR"
done
