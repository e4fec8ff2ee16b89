#!/usr/bin/env bash
# Programs from Debian that tests run directly: a C compiler (`cc`, from
# gcc) to build clients/c/forkpool_worker.c for crates/forkpool-cli/tests/c_worker.rs,
# and `ss` (iproute2), which crates/forkpool-cli/tests/sessions_pool.rs reads
# socket queues with. Idempotent: quick when both are there.
set -euo pipefail

missing=()
command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
command -v ss >/dev/null 2>&1 || missing+=(iproute2)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1; then
  sudo=(sudo)
else
  echo "missing ${missing[*]}, and installing needs root (or sudo)" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq "${missing[@]}"

command -v cc >/dev/null 2>&1 || { echo "cc still missing after apt-get install" >&2; exit 1; }
command -v ss >/dev/null 2>&1 || { echo "ss still missing after apt-get install" >&2; exit 1; }
