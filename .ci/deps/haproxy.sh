#!/usr/bin/env bash
# HAProxy from Debian, for the tests that put two pools behind a real load
# balancer (crates/forkpool-cli/tests/haproxy.rs). The tests start their own
# `haproxy -db` on loopback; the system service the package may start is
# stopped and disabled so nothing is left listening.
set -euo pipefail

if command -v haproxy >/dev/null 2>&1; then
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1; then
  sudo=(sudo)
else
  echo "haproxy is missing and installing it needs root (or sudo)" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq haproxy

# The package starts haproxy.service on machines that run systemd (and a
# SysV script elsewhere): the tests want no shared instance running.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet haproxy 2>/dev/null; then
  "${sudo[@]}" systemctl stop haproxy || true
  "${sudo[@]}" systemctl disable haproxy >/dev/null 2>&1 || true
elif [ -x /etc/init.d/haproxy ]; then
  "${sudo[@]}" /etc/init.d/haproxy stop >/dev/null 2>&1 || true
fi

command -v haproxy >/dev/null 2>&1 || { echo "haproxy still missing after apt-get install" >&2; exit 1; }
