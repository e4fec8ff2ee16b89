#!/usr/bin/env bash
# The app servers forkpool ships (forkpool-psgi, forkpool_wsgi) as they
# are in this tree against themselves at an earlier commit: the same
# forkpool binary, the same pool, the same app, wrk on loopback, rounds
# alternating which goes first, medians. It answers "did this change to
# the server cost speed?" with the server's own CPU per request as well
# as req/s, so a noisy machine shows as spread, not as a verdict.
#
#   bench/clients-ab.sh
#
# Environment:
#   PSGI_BEFORE  the commit whose clients/perl is "before"
#                (default 25f9516^: forkpool-psgi before docs/http.md)
#   WSGI_BEFORE  the commit whose clients/python is "before"
#                (default 28d002f^: forkpool_wsgi before docs/http.md)
#   SERVERS      "psgi wsgi" (default both)
#   POOLS        "exec preload" (default both: exec'd workers, --preload)
#   ROUNDS (3), DURATION (wrk seconds per cell, 5), CONCURRENCY ("16"),
#   MODES ("close keepalive")
#
# Pools run --dispatch handoff, so an older server that does not keep the
# kernel scoreboard is measured on the same path as the new one. Each pool
# is started per round and version, 16 workers at most, and stopped by pid.
# Prints one line per cell, then the medians and the after/before ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# shellcheck source=lib/server.sh
. bench/lib/server.sh

PSGI_BEFORE=${PSGI_BEFORE:-25f9516^}
WSGI_BEFORE=${WSGI_BEFORE:-28d002f^}
SERVERS=${SERVERS:-psgi wsgi}
POOLS=${POOLS:-exec preload}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5}
CONCURRENCY=${CONCURRENCY:-16}
MODES=${MODES:-close keepalive}
VENV=$root/target/py-venv
port=18750
scratch=$(mktemp -d "${TMPDIR:-/tmp}/forkpool-clients-ab.XXXXXX")
server_pid=""

die() { echo "clients-ab.sh: $*" >&2; exit 1; }

trap 'stop_server; rm -rf "$scratch"' EXIT

command -v wrk >/dev/null || die "wrk is missing: bench/apps.sh install"
[ -x "$VENV/bin/python" ] || die "no $VENV: bash .ci/deps/python.sh"
[ -x target/release/forkpool ] || cargo build --release -q -p forkpool-cli
fp=$root/target/release/forkpool

# The "before" trees, checked out once.
mkdir -p "$scratch/before-psgi" "$scratch/before-wsgi"
git archive "$PSGI_BEFORE" clients/perl | tar -x -C "$scratch/before-psgi"
git archive "$WSGI_BEFORE" clients/python | tar -x -C "$scratch/before-wsgi"


start() { # SERVER POOL VERSION
  local server=$1 pool=$2 version=$3 tree=$root preload=()
  [ "$version" = before ] && tree=$scratch/before-$server
  [ "$pool" = preload ] && preload=(--preload)
  port=$((port + 1))
  local pool_args=(run --listen "127.0.0.1:$port" --max-children 16 --dispatch handoff "${preload[@]}")
  if [ "$server" = psgi ]; then
    "$fp" "${pool_args[@]}" -- perl "$tree/clients/perl/forkpool-psgi" --no-access-log \
      bench/apps/hello.psgi >"$scratch/server.log" 2>&1 &
  else
    PYTHONPATH="$tree/clients/python:$root/bench/apps" "$fp" "${pool_args[@]}" \
      -- "$VENV/bin/python" -m forkpool_wsgi hello_flask:app --no-access-log \
      >"$scratch/server.log" 2>&1 &
  fi
  server_pid=$!
  wait_for_port "$port" || { cat "$scratch/server.log" >&2; die "$server ($version) did not start"; }
  wrk -t2 -c64 -d2s -H "Connection: close" "http://127.0.0.1:$port/" >/dev/null
  sleep 1
}

cell() { # CONCURRENCY MODE -> "req/s cpu_us/req"
  local c=$1 mode=$2 header=() before after out requests
  [ "$mode" = close ] && header=(-H "Connection: close")
  before=$(python3 bench/lib/treestat.py snapshot "$server_pid")
  out=$(wrk -t2 -c"$c" -d"${DURATION}s" "${header[@]}" "http://127.0.0.1:$port/")
  after=$(python3 bench/lib/treestat.py snapshot "$server_pid")
  requests=$(awk '/requests in/ {print $1}' <<<"$out")
  printf '%s %s\n' "$(awk '/^Requests\/sec/ {printf "%.0f", $2}' <<<"$out")" \
    "$(python3 bench/lib/treestat.py per-request "$before" "$after" "$requests" | cut -d' ' -f1)"
}

results=$scratch/results
echo "# $(date -u +%FT%TZ) $(uptime | sed 's/.*load/load/'), $(nproc) cores, ${DURATION}s per cell"
echo "# before: psgi $(git rev-parse --short "$PSGI_BEFORE"), wsgi $(git rev-parse --short "$WSGI_BEFORE"); after: this tree"
for round in $(seq "$ROUNDS"); do
  order="before after"
  [ $((round % 2)) = 0 ] && order="after before"
  for server in $SERVERS; do
    for pool in $POOLS; do
      for version in $order; do
        start "$server" "$pool" "$version"
        for c in $CONCURRENCY; do
          for mode in $MODES; do
            line="$server $pool $mode c=$c $version $(cell "$c" "$mode")"
            echo "round $round: $line"
            echo "$line" >>"$results"
          done
        done
        stop_server
      done
    done
  done
done

python3 - "$results" <<'EOF'
import statistics, sys
from collections import defaultdict
cells = defaultdict(lambda: defaultdict(lambda: ([], [])))
for line in open(sys.argv[1]):
    server, pool, mode, conc, version, rps, cpu = line.split()
    rows = cells[(server, pool, mode, conc)][version]
    rows[0].append(float(rps))
    rows[1].append(float(cpu))
print("\n| server | pool | mode | conc | req/s before | req/s after | after/before | CPU us/req before | after |")
print("|---|---|---|---|---|---|---|---|---|")
for key, v in cells.items():
    b, a = v["before"], v["after"]
    if not b[0] or not a[0]:
        continue
    rb, ra = statistics.median(b[0]), statistics.median(a[0])
    print(f"| {' | '.join(key)} | {rb:,.0f} | {ra:,.0f} | {ra / rb:.2f} | "
          f"{statistics.median(b[1]):.0f} | {statistics.median(a[1]):.0f} |")
EOF
