#!/usr/bin/env bash
# Kernel dispatch against handoff, nginx and Apache, side by side with wrk
# (issue 26): each round measures every server in turn, so the machine's
# noise falls on all of them alike; the table gives each cell's median
# over the rounds.
#
#   bench/kernel.sh            ROUNDS=3 DURATION=5 CONNS="16 64 256"
#   BIN=/tmp/forkpool-old SERVERS="kernel-deferred nginx-deferred" bench/kernel.sh
#
# Servers: the forkpool demo (release build) in `kernel` and `handoff`
# dispatch, each with and without --defer-accept 5s, and in `kernel` with
# its workers on the messages path (FORKPOOL_BY_MESSAGES=1), 16 children held
# (--min-children 16 --max-children 16); nginx (2 workers) with and
# without `deferred`, and Apache prefork, from bench/peers.sh (started and
# stopped here). For each: req/s, the server tree's CPU microseconds per
# request and its context switches per request (bench/lib/treestat.py),
# close-per-request and keep-alive.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${ROUNDS:-3}
duration=${DURATION:-5}
conns=${CONNS:-"16 64 256"}
modes=${MODES:-"close keepalive"}
bin=${BIN:-target/release/forkpool}
out=${OUT:-/tmp/forkpool-kernel-bench}
mkdir -p "$out"
rm -f "$out"/*.tsv

command -v wrk >/dev/null || { echo "kernel.sh: wrk is missing (apt-get install wrk)" >&2; exit 1; }
# BIN=path measures another build (an A/B of two commits); none is built.
[ -n "${BIN:-}" ] || cargo build --release -q -p forkpool-cli

pool_pids=()
stop_pools() {
  for pid in "${pool_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pool_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  bench/peers.sh stop >/dev/null 2>&1 || true
}
trap stop_pools EXIT

declare -A pid_of url_of
# NAME PORT ARGS...: a demo pool in the background, its pid remembered
# (here, not in a subshell, so the trap stops it).
start_pool() {
  local name=$1 port=$2
  shift 2
  "$bin" demo --listen "127.0.0.1:$port" --control "$out/$name.sock" \
    --min-children 16 --max-children 16 --min-spare 0 --max-spare 16 "$@" \
    >"$out/$name.out" 2>"$out/$name.err" &
  pool_pids+=("$!")
  pid_of[$name]=$!
}

bench/peers.sh start >/dev/null
start_pool kernel-deferred 18101 --dispatch kernel --defer-accept 5s
start_pool kernel 18102 --dispatch kernel --defer-accept 0s
start_pool handoff-deferred 18103 --dispatch handoff --defer-accept 5s
start_pool handoff 18104 --dispatch handoff --defer-accept 0s
servers=${SERVERS:-"kernel-deferred nginx-deferred handoff-deferred kernel kernel-messages nginx handoff apache"}
# The same workers on the messages path (`G`): the supervisor moves their
# records from their B/I messages instead of the workers storing them.
# (Only when measured: a build from before the path has no such workers.)
messages=
if [[ " $servers " == *" kernel-messages "* ]]; then
  messages=kernel-messages
  FORKPOOL_BY_MESSAGES=1 start_pool kernel-messages 18105 --dispatch kernel --defer-accept 0s
  url_of[kernel-messages]=http://127.0.0.1:18105/
fi
url_of[kernel-deferred]=http://127.0.0.1:18101/
url_of[kernel]=http://127.0.0.1:18102/
url_of[handoff-deferred]=http://127.0.0.1:18103/
url_of[handoff]=http://127.0.0.1:18104/
peers=/tmp/forkpool-peers
pid_of[nginx-deferred]=$(cat "$peers/nginx/nginx.pid")
pid_of[nginx]=$(cat "$peers/nginx/nginx.pid")
pid_of[apache]=$(cat "$peers/apache/apache.pid")
url_of[nginx-deferred]=http://127.0.0.1:8083/
url_of[nginx]=http://127.0.0.1:8082/
url_of[apache]=http://127.0.0.1:8081/hello
sleep 2
for name in kernel-deferred kernel $messages handoff-deferred handoff; do
  kill -0 "${pid_of[$name]}" 2>/dev/null || { echo "kernel.sh: pool $name did not start: $(cat "$out/$name.err")" >&2; exit 1; }
done
for name in kernel-deferred kernel $messages; do
  "$bin" status --json --control "$out/$name.sock" | grep -q '"dispatch":"kernel"' ||
    { echo "kernel.sh: $name is not in kernel dispatch (see $out/$name.err)" >&2; exit 1; }
done
if [ -n "$messages" ]; then
  "$bin" status --json --control "$out/kernel-messages.sock" | grep -q '"path":"messages"' ||
    { echo "kernel.sh: kernel-messages' workers are not on the messages path" >&2; exit 1; }
fi

for round in $(seq "$rounds"); do
  for mode in $modes; do
    header=()
    [ "$mode" = close ] && header=(-H "Connection: close")
    for c in $conns; do
      for name in $servers; do
        # Warm up (Apache grows its pool), then the measured window.
        wrk -t2 -c"$c" -d1s "${header[@]}" "${url_of[$name]}" >/dev/null 2>&1 || true
        before=$(python3 bench/lib/treestat.py snapshot "${pid_of[$name]}")
        result=$(wrk -t2 -c"$c" -d"${duration}s" "${header[@]}" "${url_of[$name]}" 2>&1)
        after=$(python3 bench/lib/treestat.py snapshot "${pid_of[$name]}")
        requests=$(awk '/requests in/ {print $1}' <<<"$result")
        rps=$(awk '/Requests\/sec/ {printf "%d", $2}' <<<"$result")
        errors=$(awk '/Socket errors|Non-2xx/ {printf "%s ", $0}' <<<"$result")
        per=$(python3 bench/lib/treestat.py per-request "$before" "$after" "$requests")
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$mode" "$c" "$name" "$rps" "$per" "$errors" |
          tee -a "$out/rounds.tsv" >&2
      done
    done
  done
done

# Medians per cell: req/s, CPU us/req, context switches/req.
python3 - "$out/rounds.tsv" <<'PY'
import statistics, sys
cells = {}
order = []
for line in open(sys.argv[1]):
    rnd, mode, c, name, rps, per, *_ = line.rstrip("\n").split("\t")
    f = per.split()
    key = (mode, int(c), name)
    if key not in cells:
        order.append(key)
    cells.setdefault(key, []).append((int(rps), float(f[0]), float(f[1])))
print(f"{'server':<18}{'conn':>10}{'c':>5}{'req/s':>9}{'CPU us/req':>12}{'ctxsw/req':>11}")
for key in order:
    rows = cells[key]
    mode, c, name = key
    med = lambda i: statistics.median(r[i] for r in rows)
    print(f"{name:<18}{mode:>10}{c:>5}{med(0):>9.0f}{med(1):>12.1f}{med(2):>11.2f}")
PY
