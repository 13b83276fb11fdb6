#!/usr/bin/env bash
cd "${1:-/work/ci45}"
SEL=(
 "tests/tasks/sandbox/test_sandbox.py::test_run_many_in_parallel_keeps_order"
 "tests/tasks/sandbox/test_sandbox.py::test_fork_bomb_hits_the_process_limit"
 "tests/tasks/sandbox/test_sandbox_pool.py::test_processes_of_an_earlier_check_are_gone"
 "tests/tasks/sandbox/test_sandbox_pool.py::test_output_flood_retires_the_worker_and_the_next_check_is_clean"
 "tests/tasks/sandbox/test_sandbox_pool.py::test_worker_is_replaced_after_max_checks_and_after_a_timeout"
 "tests/tasks/sandbox/test_sandbox_uids.py"
 "tests/tasks/sandbox/test_sandbox_early_runner.py"
 "tests/tasks/sandbox/test_sandbox.py::test_host_secrets_are_not_readable"
)
echo "tree $(git rev-parse --short HEAD); stress-ng --cpu 2"
stress-ng --cpu 2 --timeout 0 >/dev/null 2>&1 &
hog=$!
trap 'kill $hog 2>/dev/null' EXIT
for i in $(seq 1 30); do
  echo "== run $i $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  PYTHONDONTWRITEBYTECODE= .venv/bin/python -m pytest -q -n 0 -p no:randomly -p no:cacheprovider "${SEL[@]}" 2>&1 \
    | grep -E "passed|failed|^FAILED|^ERROR"
done
