#!/usr/bin/env bash
# The CPU hold on sleeping and on computing requests (issue 44), with and
# without --no-hold-when-cpu-bound, for one build or an A/B of two: each
# round runs every build and mode in turn on a fresh --preload Python pool
# (crates/forkpool-cli/tests/apps/sleep_or_compute_app.py, default pool
# size), so the machine's noise falls on all alike; the table gives each
# cell's median over the rounds and its range.
#
#   bench/cpu_hold.sh                    ROUNDS=5, the release build
#   BINS="before=/tmp/forkpool-old after=target/release/forkpool" bench/cpu_hold.sh
#
# Per build and mode: `sleep` 32 requests at once that sleep 1 s, the
# last answer's time (s); `cpu burst` 32 at once that compute 50 ms, the
# same; `cpu load` 16 clients of 5 ms requests for 5 s, req/s and p99
# (ms). After each, the pool's `cpu_bound` total and workers spawned.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${ROUNDS:-5}
out=${OUT:-/tmp/forkpool-cpu-hold-bench}
port=${PORT:-18431}
mkdir -p "$out"
rm -f "$out"/results.txt
if [ -z "${BINS:-}" ]; then
  cargo build --release -q -p forkpool-cli
  BINS="current=target/release/forkpool"
fi
apps=crates/forkpool-cli/tests/apps

pool=""
trap '[ -z "$pool" ] || { kill -INT "$pool" 2>/dev/null; wait "$pool" 2>/dev/null; }' EXIT

# BIN MODE-FLAGS... -- CLIENT-ARGS...: a fresh pool, one client run, the totals.
measure() {
  local bin=$1 sock=$out/pool.sock flags=()
  shift
  while [ "$1" != "--" ]; do flags+=("$1"); shift; done
  shift
  rm -f "$sock"
  PYTHONPATH=clients/python "$bin" run --preload --listen "127.0.0.1:$port" --control "$sock" \
    "${flags[@]}" -- python3 -m forkpool_wsgi --no-access-log --chdir "$apps" sleep_or_compute_app \
    >"$out/pool.out" 2>"$out/pool.err" &
  pool=$!
  for _ in $(seq 100); do
    "$bin" status --json --control "$sock" 2>/dev/null | grep -q '"line":"II"' && break
    sleep 0.1
  done
  sleep 1
  local line
  line=$(python3 bench/lib/burst.py "$port" "$@")
  local totals
  totals=$("$bin" status --json --control "$sock" | python3 -c \
    'import json,sys; t=json.load(sys.stdin)["totals"]; print("cpu_bound=%d spawned=%d" % (t["cpu_bound"], t["spawned"]))')
  kill -INT "$pool"; wait "$pool" 2>/dev/null || true; pool=""
  echo "$line $totals"
}

for round in $(seq "$rounds"); do
  for entry in $BINS; do
    name=${entry%%=*} bin=${entry#*=}
    for mode in hold nohold; do
      flags=()
      [ "$mode" = nohold ] && flags=(--no-hold-when-cpu-bound)
      echo "$name $mode sleep $(measure "$bin" "${flags[@]}" -- burst 32 '/?sleep_ms=1000')" | tee -a "$out/results.txt"
      echo "$name $mode cpu-burst $(measure "$bin" "${flags[@]}" -- burst 32 '/?cpu_ms=50')" | tee -a "$out/results.txt"
      echo "$name $mode cpu-load $(measure "$bin" "${flags[@]}" -- load 16 '/?cpu_ms=5' 5)" | tee -a "$out/results.txt"
    done
  done
done

python3 - "$out/results.txt" <<'PY'
import collections, statistics, sys
cells = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    name, mode, what, *pairs = line.split()
    for pair in pairs:
        key, value = pair.split("=")
        cells[(name, mode, what)][key].append(float(value))
print(f"{'build':<10} {'mode':<7} {'load':<10} medians [range] over the rounds")
for (name, mode, what), values in cells.items():
    shown = "  ".join(
        f"{k} {statistics.median(v):g} [{min(v):g}-{max(v):g}]" for k, v in values.items()
    )
    print(f"{name:<10} {mode:<7} {what:<10} {shown}")
PY
