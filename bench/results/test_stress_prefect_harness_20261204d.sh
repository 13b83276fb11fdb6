#!/usr/bin/env bash
# N runs in a row (default 10) of the tests on the Prefect test server beside `stress-ng --cpu 2`, one process each
# (its server started in the background after collection), from a clone after `make setup`:
# bash THIS_FILE CLONE_DIR > OUT.txt
cd "${1:?clone dir}"
N=${N:-10}
SEL=(
 "tests/testing/test_prefect_template.py"
 "tests/tasks/core/test_progress.py"
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
