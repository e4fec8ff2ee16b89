#!/usr/bin/env bash
# Milter conversations against mail filters (issue 46): C conversations
# held at once, each spread over an SMTP session as Postfix sends it
# (connect, HELO, MAIL, RCPT, DATA paused apart; headers, body streamed;
# end of message, QUIT), a new one taking each finished one's place. For
# each C: threads and memory (USS, PSS) of the filter's whole process tree,
# p50/p99 latency of a command, CPU per message, and what was lost.
#
#   bench/milter.sh                      CONVERSATIONS=100,1000,5000
#   WORK_US=2000 SESSION=20s WARMUP=20s DURATION=20s bench/milter.sh
#   CRASH_EVERY=1000 bench/milter.sh     # abort() on one message in N
#   FILTER=forkpool bench/milter.sh      # forkpool milter, same work
#   FILTER=forkpool CRASH=panic CRASH_EVERY=1000 bench/milter.sh
#   FILTER=forkpool RELOAD_AT=10s bench/milter.sh   # HUP 10 s into the window
#   FILTER='forkpool milter --listen 127.0.0.1:{port} -- RULES.toml' bench/milter.sh
#
# The default filter is bench/milter/add_header.c on Debian's libmilter
# (bash .ci/deps/mail.sh), built here into target/milter/; it spins
# WORK_US of CPU per message. FILTER replaces it with any command that
# listens on 127.0.0.1:{port} and obeys the same rules (adds a header at
# end of message). The load generator is `forkpool-bench bench-milter`
# (crates/forkpool-bench/src/bench_milter/). FILTER=forkpool runs the
# release `forkpool milter` with a rule file written to target/milter/
# that adds the same header and spins the same CPU ([bench] work_us;
# crash_every and CRASH=abort|panic), with POOL's options.
set -euo pipefail
cd "$(dirname "$0")/.."

conversations=${CONVERSATIONS:-100,1000,5000}
work_us=${WORK_US:-2000}
session=${SESSION:-20s}
warmup=${WARMUP:-20s}
duration=${DURATION:-20s}
crash_every=${CRASH_EVERY:-0}
pool=${POOL:---min-children 2 --max-children 4 --session-workers 4 --sessions-per-child 5000}

cargo build --release -q -p forkpool-bench
if [ "${FILTER:-}" = forkpool ]; then
  cargo build --release -q -p forkpool-cli
  mkdir -p target/milter
  rules=target/milter/bench-rules.toml
  {
    printf '[[add_header]]\nname = "X-Forkpool-Milter"\nvalue = "{pid}"\n\n[bench]\nwork_us = %s\n' "$work_us"
    if [ "$crash_every" != 0 ]; then
      printf 'crash_every = %s\ncrash = "%s"\n' "$crash_every" "${CRASH:-abort}"
    fi
  } >"$rules"
  FILTER="target/release/forkpool milter --listen 127.0.0.1:{port} $pool -- $rules"
elif [ -z "${FILTER:-}" ]; then
  [ -f /usr/include/libmilter/mfapi.h ] ||
    { echo "milter.sh: libmilter-dev is missing (bash .ci/deps/mail.sh)" >&2; exit 1; }
  mkdir -p target/milter
  cc -O2 -Wall -Wextra -Werror -o target/milter/add_header bench/milter/add_header.c \
    -lmilter -lpthread
  FILTER="target/milter/add_header -p {port} -w $work_us -c $crash_every"
fi

target/release/forkpool-bench bench-milter --filter "$FILTER" \
  --conversations "$conversations" --session "$session" --warmup "$warmup" \
  --duration "$duration" ${RELOAD_AT:+--reload-at "$RELOAD_AT"} ${JSON:+--json}
