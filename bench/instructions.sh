#!/usr/bin/env bash
# Instructions a closing request costs one worker, counted by callgrind
# (valgrind): a figure that does not move with the machine's load, for
# comparing two versions of a worker's code where req/s cannot tell 5%.
#
#   bash bench/instructions.sh forkpool-rack   # forkpool-rack --preload-less, kernel dispatch
#   bash bench/instructions.sh unicorn         # unicorn, preload_app, one worker
#   CMD="ruby my_worker.rb" bash bench/instructions.sh forkpool
#
# N (default 400) requests are counted after 300 to warm up, C (default 4)
# clients at a time (with 4, most connections wait on the overflow and
# are taken by the finishing worker, as under load; with 1 the worker
# sleeps between them). Both from bench/apps/hello.ru. Prints the
# instructions a request (user space: the kernel's share is not counted).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
what=${1:-forkpool-rack}
N=${N:-400}
C=${C:-4}
port=${PORT:-18091}
command -v valgrind >/dev/null || apt-get install -y -q valgrind >/dev/null
scratch=$(mktemp -d /tmp/forkpool-instructions.XXXXXX)
server=
cleanup() {
  [ -n "$server" ] && kill -TERM "$server" 2>/dev/null && wait "$server" 2>/dev/null
  rm -rf "$scratch"
}
trap cleanup EXIT
client() { python3 "$root/bench/lib/closing_client.py" "$port" "$@"; }
wait_up() {
  for _ in $(seq 240); do curl -s -m 5 -o /dev/null "http://127.0.0.1:$port/" && return; sleep 0.5; done
  echo "the server did not answer on $port" >&2
  exit 1
}
export RACK_ENV=production
case $what in
  unicorn)
    # unicorn's worker is forked by its master: counted from its start,
    # twice, and the difference taken (its start-up cancels out).
    printf 'worker_processes 1\npreload_app true\ntimeout 600\n' >"$scratch/unicorn.rb"
    count() { # REQUESTS: the worker's instructions after warm-up and REQUESTS
      (cd bench/apps && exec valgrind --tool=callgrind --callgrind-out-file="$scratch/u.%p" \
        unicorn -c "$scratch/unicorn.rb" -l "127.0.0.1:$port" hello.ru) >"$scratch/log" 2>&1 &
      server=$!
      wait_up
      client 300 "$C" >/dev/null
      local worker
      worker=$(pgrep -P "$server" | head -1)
      client "$1" "$C" >/dev/null
      kill -QUIT "$server"
      wait "$server" || true
      server=
      awk '/^totals:/ { print $2 }' "$scratch/u.$worker"*
      rm -f "$scratch"/u.*
    }
    small=$(count "$N")
    large=$(count $((3 * N)))
    echo "unicorn: $(((large - small) / (2 * N))) instructions a request (C=$C)"
    ;;
  forkpool-rack | forkpool)
    [ -x target/release/forkpool ] || cargo build --release -q -p forkpool-cli
    cmd=${CMD:-ruby -Iclients/ruby clients/ruby/forkpool-rack --no-access-log bench/apps/hello.ru}
    # shellcheck disable=SC2086 # CMD is a command line
    target/release/forkpool run --listen "127.0.0.1:$port" --min-children 1 --max-children 1 \
      --min-spare 0 --max-spare 1 --defer-accept 1s --ping-timeout 60s -- \
      valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$scratch/w.%p" $cmd \
      >"$scratch/log" 2>&1 &
    server=$!
    wait_up
    client 300 "$C" >/dev/null
    worker=$(pgrep -P "$server" | head -1)
    callgrind_control -i on "$worker" >/dev/null 2>&1
    answered=$(client "$N" "$C")
    callgrind_control -i off "$worker" >/dev/null 2>&1
    callgrind_control -d "$worker" >/dev/null 2>&1
    total=$(cat "$scratch"/w.* | awk '/^totals:/ { s += $2 } END { print s }')
    echo "$what: $((total / answered)) instructions a request ($answered answered, C=$C)"
    ;;
  *)
    echo "usage: bash bench/instructions.sh forkpool-rack|forkpool|unicorn (CMD=... for forkpool)" >&2
    exit 2
    ;;
esac
