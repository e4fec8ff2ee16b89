#!/usr/bin/env bash
# Ruby side of the Rack tests and benchmark, from Debian: the interpreter,
# Rack (the only library clients/ruby uses), Sinatra (the real app
# crates/forkpool-cli/tests/rack.rs serves), and unicorn and Puma (what
# bench/apps.sh measures forkpool-rack against; no test needs them), and
# libatomic (what the helper's scoreboard record uses for going idle in
# kernel dispatch; tests/kernel_ruby.rs checks it is used).
# Idempotent: quick when everything is there.
set -euo pipefail
. "$(dirname "$0")/../lib/apt-install.sh"

have() { command -v "$1" >/dev/null 2>&1; }
loads() { have ruby && ruby -e "require '$1'" >/dev/null 2>&1; }

missing=()
have gem || missing+=(ruby)
loads rack || missing+=(ruby-rack)
loads sinatra/base || missing+=(ruby-sinatra)
have unicorn || missing+=(unicorn)
have puma || missing+=(puma)
ldconfig -p | grep -q 'libatomic\.so\.1 ' || missing+=(libatomic1)
[ ${#missing[@]} -eq 0 ] && exit 0

apt_install "${missing[@]}"
# The packages may start services on install: none is wanted.
for svc in unicorn puma; do
  [ -x "/etc/init.d/$svc" ] && { /etc/init.d/$svc stop >/dev/null 2>&1 || true; }
done
loads rack && loads sinatra/base || { echo "ruby.sh: Rack or Sinatra still missing after apt-get install" >&2; exit 1; }
