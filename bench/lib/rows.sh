# The rows of the wrk benchmark tables (sourced, not run; bench/apps.sh and
# bench/node.sh): start a server, wait for its workers, measure each cell
# with wrk and bench/lib/treestat.py, stop it. The sourcing script sets
# root, port and die, sources server.sh first, and calls table_begin.

# Starts a table: the cells' defaults (DURATION 10 s, every server, c=16
# and c=64, close and keep-alive), a scratch directory, and the EXIT trap
# that stops the server and removes the directory.
table_begin() { # NAME
  DURATION=${DURATION:-10}
  ONLY=${ONLY:-.}
  CONCURRENCY=${CONCURRENCY:-16 64}
  MODES=${MODES:-close keepalive}
  after_warmup=
  server_pid=""
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/forkpool-$1.XXXXXX")
  trap 'stop_server; rm -rf "$scratch"' EXIT
}

# The release `forkpool`, built first if missing.
forkpool_bin() {
  # BIN=path measures another build (bench/ab.sh's A/B of two commits).
  if [ -n "${BIN:-}" ]; then
    echo "$BIN"
    return
  fi
  if [ ! -x target/release/forkpool ]; then
    cargo build --release -q -p forkpool-cli
  fi
  echo "$root/target/release/forkpool"
}

# Waits until the server's tree has its 16 workers (or `forkpool run`'s
# first ones) and has been quiet for a moment.
settle() {
  local tries=100
  while [ "$tries" -gt 0 ]; do
    local n
    n=$(python3 bench/lib/treestat.py pss "$server_pid" | cut -d' ' -f2)
    [ "$n" -ge "$1" ] && break
    tries=$((tries - 1))
    sleep 0.1
  done
  sleep 1
}

start_server() { # NAME DIR MIN_WORKERS CMD...
  local name=$1 dir=$2 min=$3
  shift 3
  port=$((port + 1))
  (cd "$dir" && exec "$@") >"$scratch/$name.out" 2>"$scratch/$name.err" &
  server_pid=$!
  wait_for_port "$port" || { cat "$scratch/$name.err" >&2; die "$name did not start"; }
  settle "$min"
}


# One wrk cell: prints "req/s p99 cpu_us/req ctxsw/req voluntary/req
# involuntary/req errors" (the last two split the context switches into
# wake-ups and preemptions).
cell() { # CONCURRENCY close|keepalive
  local c=$1 mode=$2 header=() before after out requests rps p99 errors
  [ "$mode" = close ] && header=(-H "Connection: close")
  before=$(python3 bench/lib/treestat.py snapshot "$server_pid")
  out=$(wrk -t2 -c"$c" -d"${DURATION}s" --latency "${header[@]}" "http://127.0.0.1:$port/")
  after=$(python3 bench/lib/treestat.py snapshot "$server_pid")
  requests=$(awk '/requests in/ {print $1}' <<<"$out")
  rps=$(awk '/^Requests\/sec/ {printf "%.0f", $2}' <<<"$out")
  p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
  errors=$(awk '/Non-2xx|Socket errors/ {printf "%s ", $0}' <<<"$out")
  printf '%8s %8s %s %s\n' "$rps" "$p99" "$(python3 bench/lib/treestat.py per-request "$before" "$after" "$requests")" "${errors:-}"
}

measure() { # NAME
  local name=$1 pss
  # Warm-up: an adaptive pool grows to its load, and every server's
  # workers import and touch what they need, before anything is counted.
  wrk -t2 -c64 -d2s -H "Connection: close" "http://127.0.0.1:$port/" >/dev/null
  if [ -n "$after_warmup" ]; then
    $after_warmup
  fi
  sleep 1
  for c in $CONCURRENCY; do
    for mode in $MODES; do
      printf '%-26s c=%-3s %-9s ' "$name" "$c" "$mode"
      cell "$c" "$mode"
    done
  done
  sleep 2
  pss=$(python3 bench/lib/treestat.py pss "$server_pid")
  uss=$(python3 bench/lib/treestat.py uss "$server_pid")
  printf '%-26s PSS per idle worker: %s KiB, USS %s KiB (%s processes)\n' "$name" "${pss% *}" "${uss% *}" "${pss#* }"
}

row() { # NAME DIR MIN_WORKERS CMD...
  if ! grep -Eq "$ONLY" <<<"$1"; then
    return
  fi
  start_server "$@"
  measure "$1"
  stop_server
}
