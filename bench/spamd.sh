#!/usr/bin/env bash
# forkpool-spamd against Debian's spamd, driven by the real spamc: the
# same options (-L, no Bayes, the package's rules), the same pool size,
# rounds alternating which server goes first, medians.
#
#   bench/spamd.sh
#
# Per server and concurrency c (spamc clients back to back): messages a
# second, p99 latency, CPU per message (the server's whole process tree,
# from /proc), and whether every answer was identical (spamc -R, hashed).
# Per server: the USS per child at rest after the load, and the time to
# answer a burst of 16 messages sent at once to a rested pool.
#
# Then memory: each server started afresh, MESSAGES messages at c = 16
# twice (with --refork-after, the second load once the pool has reforked:
# a refork waits for the load to ebb, and children that have served
# nothing since are clean), and the USS of its children at rest after the
# second (median and mean per child, and the pool's sum), with messages a
# second and CPU per message under it:
# forkpool-spamd plain (--refork-after 0), with --refork-after and with
# --merge-pages; spamd
# plain, and with its memory marked mergeable as systemd's MemoryKSM=yes
# marks it (bench/lib/ksm_exec.py). The merging rows run the kernel's
# same-page merging at KSM_PAGES pages a 20 ms wake-up, count ksmd's CPU
# under the load and until two full scans after it, and measure the USS
# then; the machine's KSM settings are put back at the end.
#
# Environment: ROUNDS (3), MESSAGES (messages per cell, 200), CONCURRENCY
# ("2 8 16"), CHILDREN (16: -m, and the children kept), REFORK_AFTER (16),
# KSM_PAGES (1000), MEMORY_ROUNDS (ROUNDS), MEMORY_MODES (all five:
# forkpool-spamd forkpool-spamd-refork forkpool-spamd-merge spamd
# spamd-merge; empty: none), FORKPOOL_BIN (default: this tree's
# target/release/forkpool, built if missing).
# Needs root (spamd refuses to check mail as root: both run with -u
# debian-spamd) and .ci/deps/spamassassin.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# shellcheck source=lib/server.sh
. bench/lib/server.sh

ROUNDS=${ROUNDS:-3}
MESSAGES=${MESSAGES:-200}
CONCURRENCY=${CONCURRENCY:-2 8 16}
CHILDREN=${CHILDREN:-16}
REFORK_AFTER=${REFORK_AFTER:-16}
KSM_PAGES=${KSM_PAGES:-1000}
MEMORY_ROUNDS=${MEMORY_ROUNDS:-$ROUNDS}
MEMORY_MODES=${MEMORY_MODES-forkpool-spamd forkpool-spamd-refork forkpool-spamd-merge spamd spamd-merge}
port=18783
scratch=$(mktemp -d "${TMPDIR:-/tmp}/forkpool-spamd-bench.XXXXXX")
server_pid=""
ksm=/sys/kernel/mm/ksm
ksm_saved=$(cat "$ksm/run" "$ksm/pages_to_scan")
ksm_restore() { # unmerge what the benchmark merged, then the settings as found
  echo 2 >"$ksm/run"
  set -- $ksm_saved
  echo "$2" >"$ksm/pages_to_scan"
  echo "$1" >"$ksm/run"
}
trap 'stop_server; ksm_restore; rm -rf "$scratch"' EXIT

die() { echo "spamd.sh: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "run as root (both servers run with -u debian-spamd)"
command -v spamc >/dev/null && [ -x /usr/sbin/spamd ] || die "bash .ci/deps/spamassassin.sh"
if [ -z "${FORKPOOL_BIN:-}" ]; then
  [ -x target/release/forkpool ] || cargo build --release -q -p forkpool-cli
  export FORKPOOL_BIN=$root/target/release/forkpool
fi
export PERL_HASH_SEED=0 PERL_PERTURB_KEYS=0

# The messages: the package's samples and variations of them.
examples=/usr/share/doc/spamassassin/examples
cp "$examples/sample-spam.txt" "$examples/sample-nonspam.txt" "$scratch/"
sed 's/^Subject: /Subject: Re: /' "$examples/sample-nonspam.txt" >"$scratch/subject.txt"
sed 's/$/\r/' "$examples/sample-nonspam.txt" >"$scratch/crlf.txt"
messages=("$scratch"/*.txt)

options=(-L -x -u debian-spamd -s stderr --cf='use_bayes 0' --cf='bayes_auto_learn 0'
  --cf='skip_rbl_checks 1' -m "$CHILDREN" --min-children "$CHILDREN" --min-spare 1
  --max-spare "$CHILDREN" -i "127.0.0.1:$port")

start() { # SERVER [EXTRA...]; WRAP: a command to run spamd under
  local server=$1
  shift
  if [ "$server" = spamd ]; then
    ${WRAP:-} /usr/sbin/spamd "${options[@]}" "$@" >"$scratch/server.log" 2>&1 &
  else
    perl clients/perl/forkpool-spamd "${options[@]}" --control "$scratch/control.sock" \
      "$@" >"$scratch/server.log" 2>&1 &
  fi
  server_pid=$!
  local tries=600
  until spamc -p "$port" -K >/dev/null 2>&1; do
    tries=$((tries - 1))
    [ "$tries" -gt 0 ] || die "$server did not start: $(tail -5 "$scratch/server.log")"
    sleep 0.1
  done
  # Every child up: CHILDREN children (forkpool: and the template).
  tries=600
  while [ "$(ls /proc/"$server_pid"/task/"$server_pid"/children >/dev/null 2>&1 &&
    wc -w <"/proc/$server_pid/task/$server_pid/children")" -lt "$CHILDREN" ]; do
    tries=$((tries - 1))
    [ "$tries" -gt 0 ] || break
    sleep 0.1
  done
}

# One load cell: SERVER C, the line `SERVER c=C msgs/s p99_ms cpu_us digest failed`.
cell() {
  local server=$1 c=$2 before after out
  before=$(bench/lib/treestat.py snapshot "$server_pid")
  out=$(bench/lib/spamc_load.py "$port" "$c" "$MESSAGES" "${messages[@]}")
  after=$(bench/lib/treestat.py snapshot "$server_pid")
  local cpu
  cpu=$(bench/lib/treestat.py per-request "$before" "$after" "$MESSAGES" | cut -d' ' -f1)
  echo "$server c=$c $(sed 's/[a-z_0-9]*=//g' <<<"$out" | awk -v cpu="$cpu" '{print $1, $2, cpu, $4, $5}')"
}

# The USS per child at rest, KiB (the median over the children).
rest_uss() {
  sleep 2
  bench/lib/treestat.py uss "$server_pid" | cut -d' ' -f1
}

round() { # ROUND
  local order=(forkpool-spamd spamd)
  [ $(($1 % 2)) -eq 0 ] && order=(spamd forkpool-spamd)
  for server in "${order[@]}"; do
    start "$server"
    local burst
    burst=$(bench/lib/spamc_load.py "$port" 16 16 "${messages[@]}" | sed 's/.*seconds=\([^ ]*\).*/\1/')
    for c in $CONCURRENCY; do cell "$server" "$c"; done
    echo "$server burst16 $burst uss_kib $(rest_uss)"
    stop_server
  done
}

for r in $(seq 1 "$ROUNDS"); do round "$r"; done | tee "$scratch/rounds"

ksmd_ticks() { awk '{print $14 + $15}' "/proc/$(pgrep -x ksmd)/stat"; }
reforks() {
  "$FORKPOOL_BIN" status --control "$scratch/control.sock" --json |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["totals"]["reforks"])'
}

# Memory: one load at c = 16 on a fresh server, then its children at rest.
memory() { # MODE
  local mode=$1 server=forkpool-spamd extra=() wrap="" merging=""
  case $mode in
    spamd*) server=spamd ;;
  esac
  case $mode in
    forkpool-spamd) extra=(--refork-after 0) ;;
    *refork) extra=(--refork-after "$REFORK_AFTER") ;;
    forkpool-spamd-merge) extra=(--merge-pages) merging=1 ;;
    spamd-merge) wrap="python3 $root/bench/lib/ksm_exec.py" merging=1 ;;
  esac
  if [ -n "$merging" ]; then
    echo "$KSM_PAGES" >"$ksm/pages_to_scan"
    echo 1 >"$ksm/run"
  fi
  WRAP=$wrap start "$server" "${extra[@]}"
  local k0 load scans k1 k2
  cell "$server" 16 >/dev/null
  if [ ${#extra[@]} -gt 0 ] && [ "${extra[0]}" = --refork-after ]; then
    for _ in $(seq 600); do
      [ "$(reforks)" -ge 1 ] && break
      sleep 0.1
    done
    [ "$(reforks)" -ge 1 ] || die "the pool did not refork"
  fi
  k0=$(ksmd_ticks)
  load=$(cell "$server" 16)
  k1=$(ksmd_ticks)
  if [ -n "$merging" ]; then
    scans=$(cat "$ksm/full_scans")
    for _ in $(seq 1200); do
      [ "$(cat "$ksm/full_scans")" -ge $((scans + 2)) ] && break
      sleep 0.5
    done
  else
    sleep 2
  fi
  k2=$(ksmd_ticks)
  # mode msgs/s cpu_us median mean sum count ksmd_load_ticks ksmd_rest_ticks
  echo "memory $mode $(cut -d' ' -f3,5 <<<"$load") $(bench/lib/treestat.py uss-pool "$server_pid") $((k1 - k0)) $((k2 - k1))"
  stop_server
  [ -z "$merging" ] || ksm_restore
}

for r in $(seq 1 "$MEMORY_ROUNDS"); do
  for mode in $MEMORY_MODES; do
    memory "$mode"
  done
done | tee -a "$scratch/rounds"

python3 - "$scratch/rounds" <<'PY'
import statistics, sys
from collections import defaultdict
cells, extra, digests = defaultdict(list), defaultdict(list), defaultdict(set)
memory = defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "memory":
        memory[f[1]].append([float(x) for x in f[2:10]])
    elif f[1] == "burst16":
        extra[(f[0], "burst")].append(float(f[2]))
        extra[(f[0], "uss")].append(float(f[4]))
    else:
        cells[(f[0], f[1])].append([float(x) for x in f[2:5]])
        digests[f[1]].add(f[5])
        if f[6] != "0":
            print("FAILED answers:", line.strip())
med = lambda xs: statistics.median(xs)
print("\n| c | server | msgs/s | p99 ms | CPU ms/msg |")
print("|---|---|---|---|---|")
for (server, c), rows in sorted(cells.items(), key=lambda kv: (int(kv[0][1][2:]), kv[0][0])):
    cols = list(zip(*rows))
    print(f"| {c[2:]} | {server} | {med(cols[0]):.2f} | {med(cols[1]):.0f} | {med(cols[2]) / 1000:.0f} |")
for c in sorted(digests, key=lambda c: int(c[2:])):
    print(f"{c}: answers {'identical' if len(digests[c]) == 1 else 'DIFFER'} across servers and rounds")
for key, values in sorted(extra.items()):
    print(f"{' '.join(key)}: median {med(values):.2f} ({', '.join(f'{v:.2f}' for v in values)})")
print("\n| at rest after the c=16 load | msgs/s | CPU ms/msg | USS/child median KiB | mean KiB | pool MiB | ksmd CPU s (load, rest) |")
print("|---|---|---|---|---|---|---|")
for mode, rows in memory.items():
    c = list(zip(*rows))
    print(f"| {mode} | {med(c[0]):.2f} | {med(c[1]) / 1000:.0f} | {med(c[2]):.0f} | {med(c[3]):.0f} | "
          f"{med(c[4]) / 1024:.0f} | {med(c[6]) / 100:.1f}, {med(c[7]) / 100:.1f} |")
PY
