#!/usr/bin/env bash
# Ruby side of the Rack tests and benchmark, from Debian: the interpreter,
# Rack (the only library clients/ruby uses), Sinatra (the real app the
# tests serve), and unicorn and Puma (what bench/apps.sh measures the Rack
# server against; no test needs them). Idempotent: quick when all is there.
set -euo pipefail

missing=()
command -v ruby >/dev/null 2>&1 || missing+=(ruby)
command -v gem >/dev/null 2>&1 || missing+=(ruby)
ruby -e 'require "rack"' >/dev/null 2>&1 || missing+=(ruby-rack)
ruby -e 'require "sinatra/base"' >/dev/null 2>&1 || missing+=(ruby-sinatra)
command -v unicorn >/dev/null 2>&1 || missing+=(unicorn)
command -v puma >/dev/null 2>&1 || missing+=(puma)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1; then
  sudo=(sudo)
else
  echo "ruby.sh: ${missing[*]} missing and installing needs root (or sudo)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# Try without a fresh index first (quick when the machine's is recent).
if ! "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The Debian packages may start services on install: none is wanted.
for svc in unicorn puma; do
  if [ -x "/etc/init.d/$svc" ]; then
    "${sudo[@]}" "/etc/init.d/$svc" stop >/dev/null 2>&1 || true
  fi
done
ruby -e 'require "rack"; require "sinatra/base"' || { echo "ruby.sh: rack or sinatra still missing after apt-get install" >&2; exit 1; }
