#!/usr/bin/env bash
# tmux: the pseudo-terminal `forkpool top`'s screen test runs in
# (crates/forkpool-cli/tests/top.rs).
set -euo pipefail
if command -v tmux >/dev/null 2>&1; then
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq tmux
