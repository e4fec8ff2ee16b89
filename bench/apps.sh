#!/usr/bin/env bash
# WSGI and PSGI "hello" apps side by side, with wrk on loopback, the same
# worker cap (16) everywhere:
#
#   Flask:  forkpool run -- python -m forkpool_wsgi   (target/py-venv), in
#           handoff (the default) and shared dispatch, and with --preload
#           (also with --no-hold-when-cpu-bound: a pool that grows to 16);
#           in kernel dispatch, adaptive (also --preload) and with 16
#           workers held
#           gunicorn -w 16 (sync), gunicorn --preload -w 16
#   Plack:  forkpool run -- perl clients/perl/forkpool-psgi, also --preload
#           (and --preload --no-hold-when-cpu-bound)
#           starman --workers 16
#   Rack:   forkpool run -- ruby clients/ruby/forkpool-rack, in handoff and
#           kernel dispatch (the default), each also with --defer-accept 1s
#           (unicorn's default), also --preload (in the default dispatch,
#           kernel, also with --defer-accept 1s, reforked after 1000
#           connections, and in order and shared),
#           16 workers held (--min-children 16), against
#           unicorn (16 workers, also preload_app) and
#           Puma (-w 16 -t 1:1, also --preload), RACK_ENV=production;
#           then with YJIT on in every server (RUBY_YJIT_ENABLE=1):
#           forkpool-rack --preload --defer-accept 1s, also reforked,
#           unicorn preload_app and Puma --preload
#
#   bench/apps.sh install   Flask+gunicorn venv (.ci/deps/python.sh), wrk,
#                           and Starman + Plack from Debian (needs root/sudo);
#                           ruby, Rack, unicorn and Puma (.ci/deps/ruby.sh)
#   bench/apps.sh run       the table (installs first when something is missing)
#
# For each server and each of c=16 and c=64, close-per-request and
# keep-alive: requests/s and p99 (wrk --latency), server CPU per request
# (utime+stime of the whole process tree over the window) and context
# switches per request, all, voluntary and involuntary
# (bench/lib/treestat.py), then PSS per idle worker (the mean) and USS
# (the median: a template or master among the children does not count).
# Then one row driven by forkpool's own load generator. Environment:
# BIN (the forkpool binary to measure; default: this checkout's release
# build), DURATION (wrk seconds per cell, default 10), ONLY (a regexp of server
# names to run), CONCURRENCY (default "16 64") and MODES (default
# "close keepalive"), the cells of each row; ROUNDS (default 1) repeats
# the table and adds the medians. Every server listens on
# 127.0.0.1 and is stopped by pid.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# shellcheck source=lib/server.sh
. bench/lib/server.sh
# shellcheck source=lib/rows.sh
. bench/lib/rows.sh

ROUNDS=${ROUNDS:-1}
VENV=$root/target/py-venv
WORKERS=16
port=18700
# after_warmup: a command run after a row's warm-up (set around one row).
table_begin apps

die() { echo "apps.sh: $*" >&2; exit 1; }

install() {
  bash .ci/deps/python.sh
  if ! command -v starman >/dev/null || ! perl -MPlack -e1 2>/dev/null; then
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq starman libplack-perl
  fi
  bash .ci/deps/ruby.sh
}


# Our own load generator: `forkpool-bench`, or `forkpool bench` before it.
bench_cmd() {
  if [ -x target/release/forkpool-bench ]; then
    echo "$root/target/release/forkpool-bench"
  else
    echo "$(forkpool_bin) bench"
  fi
}


# Waits (at most 20 s) until the pool behind control socket $1 has
# reforked and every slot's worker is of the latest generation: a reforked
# row is measured after its roll, never during it.
rolled() { # CONTROL
  local tries=200
  while [ "$tries" -gt 0 ]; do
    "$(forkpool_bin)" status --json --control "$1" | python3 -c '
import json, sys
s = json.load(sys.stdin)
gens = [c["generation"] for c in s["slots"] if c]
sys.exit(0 if s["generation"] > 1 and gens and all(g == s["generation"] for g in gens) else 1)
' && return 0
    tries=$((tries - 1))
    sleep 0.1
  done
  die "the pool at $1 did not finish its refork"
}

run() {
  command -v wrk >/dev/null && [ -x "$VENV/bin/gunicorn" ] && command -v starman >/dev/null \
    && command -v unicorn >/dev/null && command -v puma >/dev/null || install
  local fp
  fp=$(forkpool_bin)
  echo "# $(date -u +%FT%TZ) load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores, ${DURATION}s per cell"
  echo "# server                     conc  mode         req/s      p99 cpu_us/req ctxsw/req vol/req invol/req [errors]"
  export PYTHONPATH=$root/clients/python
  row forkpool-wsgi bench/apps 2 "$fp" run --listen "127.0.0.1:$((port + 1))" --max-children "$WORKERS" \
    --control "$scratch/control.sock" -- "$VENV/bin/python" -m forkpool_wsgi hello_flask:app --no-access-log
  row forkpool-wsgi-shared bench/apps 2 "$fp" run --listen "127.0.0.1:$((port + 1))" --max-children "$WORKERS" \
    --dispatch shared --control "$scratch/control-shared.sock" \
    -- "$VENV/bin/python" -m forkpool_wsgi hello_flask:app --no-access-log
  row forkpool-wsgi-preload bench/apps 2 "$fp" run --listen "127.0.0.1:$((port + 1))" --max-children "$WORKERS" \
    --preload --control "$scratch/control-preload.sock" \
    -- "$VENV/bin/python" -m forkpool_wsgi hello_flask:app --no-access-log
  row forkpool-wsgi-preload-nohold bench/apps 2 "$fp" run --listen "127.0.0.1:$((port + 1))" --max-children "$WORKERS" \
    --preload --no-hold-when-cpu-bound --control "$scratch/control-preload-nohold.sock" \
    -- "$VENV/bin/python" -m forkpool_wsgi hello_flask:app --no-access-log
  # Kernel dispatch: the kernel gives each connection to the lowest idle
  # worker's own socket (under --preload too: each forked worker is seated).
  row forkpool-wsgi-kernel bench/apps 2 "$fp" run --listen "127.0.0.1:$((port + 1))" --max-children "$WORKERS" \
    --dispatch kernel --control "$scratch/control-kernel.sock" \
    -- "$VENV/bin/python" -m forkpool_wsgi hello_flask:app --no-access-log
  row forkpool-wsgi-kernel-deferred bench/apps 2 "$fp" run --listen "127.0.0.1:$((port + 1))" --max-children "$WORKERS" \
    --dispatch kernel --defer-accept 1s --control "$scratch/control-kernel-deferred.sock" \
    -- "$VENV/bin/python" -m forkpool_wsgi hello_flask:app --no-access-log
  row forkpool-wsgi-kernel-preload bench/apps 2 "$fp" run --listen "127.0.0.1:$((port + 1))" --max-children "$WORKERS" \
    --dispatch kernel --preload --control "$scratch/control-kernel-preload.sock" \
    -- "$VENV/bin/python" -m forkpool_wsgi hello_flask:app --no-access-log
  row forkpool-wsgi-kernel-held bench/apps "$WORKERS" "$fp" run --listen "127.0.0.1:$((port + 1))" \
    --min-children "$WORKERS" --max-children "$WORKERS" --min-spare 0 --max-spare "$WORKERS" \
    --dispatch kernel --control "$scratch/control-kernel-held.sock" \
    -- "$VENV/bin/python" -m forkpool_wsgi hello_flask:app --no-access-log
  row gunicorn-sync bench/apps "$WORKERS" "$VENV/bin/gunicorn" -w "$WORKERS" -b "127.0.0.1:$((port + 1))" hello_flask:app
  row gunicorn-preload bench/apps "$WORKERS" "$VENV/bin/gunicorn" --preload -w "$WORKERS" -b "127.0.0.1:$((port + 1))" hello_flask:app
  if [ -e clients/perl/forkpool-psgi ]; then
    row forkpool-psgi . 2 "$fp" run --listen "127.0.0.1:$((port + 1))" --max-children "$WORKERS" \
      --control "$scratch/control-psgi.sock" -- perl clients/perl/forkpool-psgi --no-access-log bench/apps/hello.psgi
    row forkpool-psgi-preload . 2 "$fp" run --listen "127.0.0.1:$((port + 1))" --max-children "$WORKERS" \
      --preload --control "$scratch/control-psgi-preload.sock" -- perl clients/perl/forkpool-psgi --no-access-log bench/apps/hello.psgi
    row forkpool-psgi-preload-nohold . 2 "$fp" run --listen "127.0.0.1:$((port + 1))" --max-children "$WORKERS" \
      --preload --no-hold-when-cpu-bound --control "$scratch/control-psgi-preload-nohold.sock" \
      -- perl clients/perl/forkpool-psgi --no-access-log bench/apps/hello.psgi
  else
    echo "forkpool-psgi              skipped: clients/perl/forkpool-psgi does not exist yet"
  fi
  row starman bench/apps "$WORKERS" starman --workers "$WORKERS" --listen "127.0.0.1:$((port + 1))" hello.psgi
  rack_rows "$fp"
  if grep -Eq "$ONLY" <<<forkpool-bench; then
    echo "# forkpool's own load generator against forkpool-wsgi:"
    start_server forkpool-wsgi-bench bench/apps 2 "$fp" run --listen "127.0.0.1:$((port + 1))" \
      --max-children "$WORKERS" --control "$scratch/control-b.sock" \
      -- "$VENV/bin/python" -m forkpool_wsgi hello_flask:app --no-access-log
    # shellcheck disable=SC2046
    $(bench_cmd) --peer "wsgi=http://127.0.0.1:$port/" --only throughput --modes handoff \
      --concurrency 16,64 --duration "${DURATION}s" || true
    stop_server
  fi
}

# forkpool-rack, unicorn and Puma on bench/apps/hello.ru, 16 workers each.
rack_rows() { # FORKPOOL
  local fp=$1 held=(--min-children "$WORKERS" --max-children "$WORKERS" --min-spare 0 --max-spare "$WORKERS")
  export RACK_ENV=production
  # unicorn defers accepts (TCP_DEFER_ACCEPT, 1 s) by default: these rows
  # do too.
  local dispatch name
  for dispatch in handoff kernel; do
    name=forkpool-rack
    [ "$dispatch" = handoff ] || name=forkpool-rack-$dispatch
    row "$name" . "$WORKERS" "$fp" run --listen "127.0.0.1:$((port + 1))" "${held[@]}" \
      --dispatch "$dispatch" --control "$scratch/control-$name.sock" \
      -- ruby -Iclients/ruby clients/ruby/forkpool-rack --no-access-log bench/apps/hello.ru
    row "$name-deferred" . "$WORKERS" "$fp" run --listen "127.0.0.1:$((port + 1))" "${held[@]}" \
      --dispatch "$dispatch" --defer-accept 1s --control "$scratch/control-$name-deferred.sock" \
      -- ruby -Iclients/ruby clients/ruby/forkpool-rack --no-access-log bench/apps/hello.ru
  done
  row forkpool-rack-preload . "$WORKERS" "$fp" run --listen "127.0.0.1:$((port + 1))" "${held[@]}" \
    --preload --control "$scratch/control-rack-preload.sock" \
    -- ruby -Iclients/ruby clients/ruby/forkpool-rack --no-access-log bench/apps/hello.ru
  row forkpool-rack-preload-deferred . "$WORKERS" "$fp" run --listen "127.0.0.1:$((port + 1))" "${held[@]}" \
    --preload --defer-accept 1s --control "$scratch/control-rack-preload-deferred.sock" \
    -- ruby -Iclients/ruby clients/ruby/forkpool-rack --no-access-log bench/apps/hello.ru
  # Reforked (pitchfork's idea): once slot 0 has served 1000 connections
  # (during the warm-up), the pool rolls onto workers forked from it, so
  # they share its warm pages (inline caches, the heap it grew).
  after_warmup="rolled $scratch/control-rack-preload-refork.sock"
  row forkpool-rack-preload-refork . "$WORKERS" "$fp" run --listen "127.0.0.1:$((port + 1))" "${held[@]}" \
    --preload --refork-after 1000 --control "$scratch/control-rack-preload-refork.sock" \
    -- ruby -Iclients/ruby clients/ruby/forkpool-rack --no-access-log bench/apps/hello.ru
  after_warmup=
  # The other dispatch modes: workers accept themselves (when told, or
  # whenever the listener is readable), as unicorn's do.
  local mode
  for mode in order shared; do
    row "forkpool-rack-preload-$mode" . "$WORKERS" "$fp" run --listen "127.0.0.1:$((port + 1))" "${held[@]}" \
      --preload --dispatch "$mode" --control "$scratch/control-rack-preload-$mode.sock" \
      -- ruby -Iclients/ruby clients/ruby/forkpool-rack --no-access-log bench/apps/hello.ru
  done
  printf 'worker_processes %s\n' "$WORKERS" >"$scratch/unicorn.rb"
  printf 'worker_processes %s\npreload_app true\n' "$WORKERS" >"$scratch/unicorn-preload.rb"
  row unicorn bench/apps "$WORKERS" unicorn -c "$scratch/unicorn.rb" -l "127.0.0.1:$((port + 1))" hello.ru
  row unicorn-preload bench/apps "$WORKERS" unicorn -c "$scratch/unicorn-preload.rb" \
    -l "127.0.0.1:$((port + 1))" hello.ru
  row puma bench/apps "$WORKERS" puma -w "$WORKERS" -t 1:1 -b "tcp://127.0.0.1:$((port + 1))" hello.ru
  row puma-preload bench/apps "$WORKERS" puma -w "$WORKERS" -t 1:1 --preload \
    -b "tcp://127.0.0.1:$((port + 1))" hello.ru
  # With YJIT on in every server (Ruby 3.1: experimental, off unless
  # asked for; none of the three turns it on itself).
  row forkpool-rack-preload-yjit . "$WORKERS" env RUBY_YJIT_ENABLE=1 "$fp" run --listen "127.0.0.1:$((port + 1))" \
    "${held[@]}" --preload --defer-accept 1s --control "$scratch/control-rack-preload-yjit.sock" \
    -- ruby -Iclients/ruby clients/ruby/forkpool-rack --no-access-log bench/apps/hello.ru
  # Reforked, the workers share the machine code slot 0's YJIT compiled.
  after_warmup="rolled $scratch/control-rack-preload-refork-yjit.sock"
  row forkpool-rack-preload-refork-yjit . "$WORKERS" env RUBY_YJIT_ENABLE=1 "$fp" run \
    --listen "127.0.0.1:$((port + 1))" "${held[@]}" --preload --refork-after 1000 \
    --control "$scratch/control-rack-preload-refork-yjit.sock" \
    -- ruby -Iclients/ruby clients/ruby/forkpool-rack --no-access-log bench/apps/hello.ru
  after_warmup=
  row unicorn-preload-yjit bench/apps "$WORKERS" env RUBY_YJIT_ENABLE=1 unicorn -c "$scratch/unicorn-preload.rb" \
    -l "127.0.0.1:$((port + 1))" hello.ru
  row puma-preload-yjit bench/apps "$WORKERS" env RUBY_YJIT_ENABLE=1 puma -w "$WORKERS" -t 1:1 --preload \
    -b "tcp://127.0.0.1:$((port + 1))" hello.ru
  unset RACK_ENV
}

# ROUNDS (default 1) runs the whole table that many times, one after the
# other, then prints each cell's median with the rounds' range
# (bench/lib/medians.py): on a shared machine one round's rows, run in a
# fixed order, drift with the load.
# A round's rows are printed when it ends (run stays in this shell, so
# the EXIT trap still stops its server).
rounds() {
  local r
  if [ "$ROUNDS" -le 1 ]; then
    run
    return
  fi
  for r in $(seq "$ROUNDS"); do
    run >"$scratch/round-$r.out"
    echo "## round $r of $ROUNDS"
    cat "$scratch/round-$r.out"
  done
  python3 bench/lib/medians.py "$scratch"/round-*.out
}

case "${1:-}" in
  install) install ;;
  run) rounds ;;
  *) die "usage: bench/apps.sh install|run" ;;
esac
