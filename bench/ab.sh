#!/usr/bin/env bash
# An A/B of two forkpool builds, side by side: each round runs one of the
# benchmark scripts once with the build before and once with the build
# after (alternating which goes first), so the machine's noise falls on
# both alike; the table gives each cell's median over the rounds and the
# after/before ratios of requests a second and server CPU per request.
#
#   BEFORE=/tmp/old/forkpool AFTER=target/release/forkpool bench/ab.sh kernel
#   BEFORE=... AFTER=... ONLY='forkpool' CONCURRENCY=16 bench/ab.sh apps
#
# kernel: bench/kernel.sh's forkpool rows (SERVERS defaults to the four
# demo pools, no peers needed in the table); apps: bench/apps.sh's rows
# matching ONLY (default: forkpool's). ROUNDS (default 3), DURATION and
# CONNS / CONCURRENCY pass through. Build both first, e.g.
#   git worktree add /tmp/old <commit> && (cd /tmp/old && cargo build --release -p forkpool-cli)
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:?"usage: BEFORE=bin AFTER=bin bench/ab.sh kernel|apps"}
before=${BEFORE:?"BEFORE=path of the forkpool binary built before"}
after=${AFTER:?"AFTER=path of the forkpool binary built after"}
rounds=${ROUNDS:-3}
out=$(mktemp -d "${TMPDIR:-/tmp}/forkpool-ab.XXXXXX")
trap 'rm -rf "$out"' EXIT
for bin in "$before" "$after"; do
  [ -x "$bin" ] || { echo "ab.sh: $bin is not an executable" >&2; exit 1; }
done

# One run of the chosen script with BIN=$2, its cells appended to $1 as
# "name<TAB>c<TAB>mode<TAB>req/s<TAB>cpu us/req".
run() { # FILE BIN
  local file=$1 bin=$2
  case $which in
    kernel)
      BIN=$bin ROUNDS=1 OUT="$out/kernel-run" \
        SERVERS="${SERVERS:-kernel-deferred kernel handoff-deferred handoff}" \
        bash bench/kernel.sh >/dev/null 2>"$out/kernel.err" ||
        { tail -20 "$out/kernel.err" >&2; exit 1; }
      awk -F'\t' '{split($6, per, " "); printf "%s\t%s\t%s\t%s\t%s\n", $4, $3, $2, $5, per[1]}' \
        "$out/kernel-run/rounds.tsv" >>"$file"
      ;;
    apps)
      { BIN=$bin ONLY="${ONLY:-forkpool}" ROUNDS=1 bash bench/apps.sh run 2>"$out/apps.err" ||
        { tail -20 "$out/apps.err" >&2; exit 1; }; } |
        awk '$2 ~ /^c=/ && $4 ~ /^[0-9]+$/ {
               sub("c=", "", $2); printf "%s\t%s\t%s\t%s\t%s\n", $1, $2, $3, $4, $6 }' >>"$file"
      ;;
    *) echo "ab.sh: unknown benchmark $which (kernel or apps)" >&2; exit 1 ;;
  esac
}

for round in $(seq "$rounds"); do
  if [ $((round % 2)) -eq 1 ]; then
    run "$out/before.tsv" "$before"
    run "$out/after.tsv" "$after"
  else
    run "$out/after.tsv" "$after"
    run "$out/before.tsv" "$before"
  fi
  echo "ab.sh: round $round of $rounds done" >&2
done

python3 - "$out/before.tsv" "$out/after.tsv" <<'PY'
import statistics, sys
def cells(path):
    got, order = {}, []
    for line in open(path):
        name, c, mode, rps, cpu = line.rstrip("\n").split("\t")
        key = (name, int(c), mode)
        if key not in got:
            order.append(key)
        got.setdefault(key, []).append((float(rps), float(cpu)))
    return got, order
before, order = cells(sys.argv[1])
after, _ = cells(sys.argv[2])
print(f"{'server':<26}{'c':>5} {'conn':<10}{'req/s before':>13}{'after':>9}{'ratio':>7}"
      f"{'CPU us/req before':>19}{'after':>7}{'ratio':>7}")
for key in order:
    if key not in after:
        continue
    med = lambda rows, i: statistics.median(r[i] for r in rows)
    b_rps, a_rps = med(before[key], 0), med(after[key], 0)
    b_cpu, a_cpu = med(before[key], 1), med(after[key], 1)
    name, c, mode = key
    print(f"{name:<26}{c:>5} {mode:<10}{b_rps:>13.0f}{a_rps:>9.0f}{a_rps / b_rps:>7.2f}"
          f"{b_cpu:>19.0f}{a_cpu:>7.0f}{a_cpu / b_cpu if b_cpu else 0:>7.2f}")
PY
