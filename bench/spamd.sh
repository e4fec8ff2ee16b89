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
# answer a burst of 16 messages sent at once to a rested pool. Then
# forkpool-spamd's USS per child with and without --refork-after.
#
# Environment: ROUNDS (3), MESSAGES (messages per cell, 200), CONCURRENCY
# ("2 8 16"), CHILDREN (16: -m, and the children kept), REFORK_AFTER (16),
# FORKPOOL_BIN (default: this tree's target/release/forkpool, built if
# missing).
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
port=18783
scratch=$(mktemp -d "${TMPDIR:-/tmp}/forkpool-spamd-bench.XXXXXX")
server_pid=""
trap 'stop_server; rm -rf "$scratch"' EXIT

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

start() { # SERVER [EXTRA...]
  local server=$1
  shift
  if [ "$server" = spamd ]; then
    /usr/sbin/spamd "${options[@]}" "$@" >"$scratch/server.log" 2>&1 &
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

# forkpool-spamd with --refork-after: the same warm-up, then the USS.
for r in $(seq 1 "$ROUNDS"); do
  for mode in plain refork; do
    extra=()
    [ "$mode" = refork ] && extra=(--refork-after "$REFORK_AFTER")
    start forkpool-spamd "${extra[@]}"
    # Enough messages for the lowest slot to serve REFORK_AFTER of them.
    MESSAGES=$((REFORK_AFTER * 8)) cell forkpool-spamd 16 >/dev/null
    echo "refork $mode uss_kib $(rest_uss)"
    stop_server
  done
done | tee -a "$scratch/rounds"

python3 - "$scratch/rounds" <<'PY'
import statistics, sys
from collections import defaultdict
cells, extra, digests = defaultdict(list), defaultdict(list), defaultdict(set)
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "refork":
        extra[("refork", f[1])].append(float(f[3]))
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
PY
