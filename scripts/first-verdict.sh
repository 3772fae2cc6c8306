#!/usr/bin/env bash
# How long a newcomer waits for the first verdict (issue #47 item 1), measured as they meet it:
# `make bench` on an empty cache, from the command to the first episode's verdict line.
#
#   scripts/first-verdict.sh [CACHE_DIR]     # default: a new empty folder under /tmp
#
# It runs `rootbench bench --limit 1`: the default bench's first episode (the default subset in
# the order that needs the fewest builds), which builds exactly what the default bench builds
# before its first verdict (llama-server, the model, the first image beside llama-server, that
# image's snapshot) and no more. Give it a quiet machine: anything else running makes the
# figure larger. It prints each build's and the episode's own lines with the seconds since the
# start, then the total; nothing is asserted (this is a measurement, not a test). The cache it
# fills is left behind (delete it, or reuse it as ROOTBENCH_CACHE).
set -euo pipefail

cd "$(dirname "$0")/.."
cache="${1:-$(mktemp -d /tmp/rootbench-fresh-cache.XXXXXX)}"
if [ -n "$(ls -A "$cache" 2>/dev/null)" ]; then
  echo "first-verdict: $cache is not empty; a fresh machine's cache is (give an empty folder)" >&2
  exit 2
fi
export ROOTBENCH_CACHE="$cache"
echo "first-verdict: cache $cache, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
start=$(date +%s)
make --no-print-directory setup >/dev/null
set +e
.venv/bin/python -m runner bench --limit 1 --runs-dir "$cache/runs" 2>&1 \
  | while IFS= read -r line; do printf '%6ds  %s\n' "$(( $(date +%s) - start ))" "$line"; done
status=${PIPESTATUS[0]}
set -e
end=$(date +%s)
echo "first-verdict: $(( end - start )) s from the command to the first verdict (exit $status)"
exit "$status"
