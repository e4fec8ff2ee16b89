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
#   FILTER='forkpool milter --listen 127.0.0.1:{port} -- RULES.toml' bench/milter.sh
#
# The default filter is bench/milter/add_header.c on Debian's libmilter
# (bash .ci/deps/mail.sh), built here into target/milter/; it spins
# WORK_US of CPU per message. FILTER replaces it with any command that
# listens on 127.0.0.1:{port} and obeys the same rules (adds a header at
# end of message). The load generator is `forkpool-bench bench-milter`
# (crates/forkpool-bench/src/bench_milter/).
set -euo pipefail
cd "$(dirname "$0")/.."

conversations=${CONVERSATIONS:-100,1000,5000}
work_us=${WORK_US:-2000}
session=${SESSION:-20s}
warmup=${WARMUP:-20s}
duration=${DURATION:-20s}
crash_every=${CRASH_EVERY:-0}

cargo build --release -q -p forkpool-bench
if [ -z "${FILTER:-}" ]; then
  [ -f /usr/include/libmilter/mfapi.h ] ||
    { echo "milter.sh: libmilter-dev is missing (bash .ci/deps/mail.sh)" >&2; exit 1; }
  mkdir -p target/milter
  cc -O2 -Wall -Wextra -Werror -o target/milter/add_header bench/milter/add_header.c \
    -lmilter -lpthread
  FILTER="target/milter/add_header -p {port} -w $work_us -c $crash_every"
fi

target/release/forkpool-bench bench-milter --filter "$FILTER" \
  --conversations "$conversations" --session "$session" --warmup "$warmup" \
  --duration "$duration" ${JSON:+--json}
