#!/usr/bin/env bash
# The Node "hello" handler (bench/apps/hello_node.js), 16 workers each:
#
#   node-cluster     Node's cluster module (bench/apps/node_cluster.js):
#                    the primary accepts and hands connections round-robin
#   forkpool-node    forkpool run --min-children 16 --max-children 16 --
#                    node clients/node/forkpool-node.js: the default mode,
#                    kernel dispatch by the messages path (each worker
#                    accepts on its own socket, and the kernel queues each
#                    connection on the lowest idle one: clients/node/README.md)
#   forkpool-node-none  the same in --dispatch none (every worker accepts
#                    on the shared listener)
#
#   bench/node.sh run   the table (needs node and wrk: .ci/deps/node.sh,
#                       .ci/deps/perl.sh)
#
# Cells as in bench/apps.sh (bench/lib/rows.sh): c=16 and c=64, close per
# request and keep-alive; requests/s, p99, CPU and context switches per
# request for the whole process tree, then PSS and USS per idle worker.
# Environment: DURATION (default 10), ONLY, CONCURRENCY, MODES. Every
# server listens on 127.0.0.1 and is stopped by pid. PM2 is not measured:
# it does not install from npm without the network.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# shellcheck source=lib/server.sh
. bench/lib/server.sh
# shellcheck source=lib/rows.sh
. bench/lib/rows.sh

WORKERS=16
port=18800
table_begin node

die() { echo "node.sh: $*" >&2; exit 1; }

run() {
  command -v node >/dev/null && command -v wrk >/dev/null || die "needs node and wrk"
  local fp
  fp=$(forkpool_bin)
  echo "# $(date -u +%FT%TZ) load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores, ${DURATION}s per cell, node $(node --version)"
  echo "# server                     conc  mode         req/s      p99 cpu_us/req ctxsw/req vol/req invol/req [errors]"
  row node-cluster bench/apps "$WORKERS" node node_cluster.js "$WORKERS" "$((port + 1))"
  row forkpool-node bench/apps "$WORKERS" "$fp" run --listen "127.0.0.1:$((port + 1))" \
    --min-children "$WORKERS" --max-children "$WORKERS" --min-spare 0 --max-spare "$WORKERS" \
    --control "$scratch/control.sock" \
    -- node "$root/clients/node/forkpool-node.js" hello_node.js
  row forkpool-node-none bench/apps "$WORKERS" "$fp" run --listen "127.0.0.1:$((port + 1))" \
    --dispatch none --min-children "$WORKERS" --control "$scratch/control.sock" \
    -- node "$root/clients/node/forkpool-node.js" hello_node.js
}

case "${1:-}" in
  run) run ;;
  *) die "usage: bench/node.sh run" ;;
esac
