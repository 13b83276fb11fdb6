#!/bin/bash
# Set-up plus the sample run from a fresh clone, every cache empty (issue 27): clones REPO (default /work/main)
# into /tmp/fresh and runs `make run` there under /usr/bin/time -v with new pip, uv and llama-server caches, so
# the packages are downloaded and llama-server is compiled. Every output line is timestamped; the moments set-up
# finished and the llama-server binary appeared are printed with the load average. Run it under the lock:
#   flock /tmp/evolforge-bench.lock bash bench/bench_setup.sh [REPO] > /tmp/bench-setup.out 2>&1
set -u
repo=${1:-/work/main}
version=$(sed -n 's/^LLAMA_CPP_PYTHON_VERSION = "\(.*\)"$/\1/p' "$repo/tasks/core/llama_server.py")
rm -rf /tmp/fresh /tmp/fresh-cache /tmp/fresh-pip /tmp/fresh-uv
mkdir -p /tmp/fresh-cache /tmp/fresh-pip /tmp/fresh-uv
echo "start $(date +%T) $(uptime)"
git clone -q "$repo" /tmp/fresh && cd /tmp/fresh && git log --oneline -1
( for _ in $(seq 720); do sleep 5;
    [ -f /tmp/fresh/.venv/.installed ] && { echo "$(date +%T) setup done $(uptime)"; break; }
  done ) &
( for _ in $(seq 720); do sleep 5;
    [ -x "/tmp/fresh-cache/llama-server/$version/llama-server" ] && { echo "$(date +%T) llama-server built $(uptime)"; break; }
  done ) &
PIP_CACHE_DIR=/tmp/fresh-pip UV_CACHE_DIR=/tmp/fresh-uv EVOLFORGE_CACHE=/tmp/fresh-cache /usr/bin/time -v make run 2>&1 \
  | while IFS= read -r l; do printf '%s %s\n' "$(date +%T)" "$l"; done
echo "end $(date +%T) $(uptime)"
wait
