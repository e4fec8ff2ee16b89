#!/usr/bin/env bash
# Mail software from Debian for the milter tests and benchmarks: Postfix
# (the tests run a private instance of it: crates/forkpool-cli/tests/
# common/postfix_support.rs), libmilter's headers (the C filter forkpool's
# milter is measured against, bench/milter/), pymilter (the same filter
# in Python) and miltertest (a milter client nobody here wrote, driven by
# Lua scripts). Postfix is installed with "No configuration": no system
# instance is set up or started.
set -euo pipefail
# Postfix's programs live in /usr/sbin, which a non-root PATH may lack.
export PATH="$PATH:/usr/sbin"

missing=()
command -v postconf >/dev/null 2>&1 || missing+=(postfix)
[ -f /usr/include/libmilter/mfapi.h ] || missing+=(libmilter-dev)
command -v miltertest >/dev/null 2>&1 || missing+=(miltertest)
# Debian's Python: pymilter is a Debian package, not a PyPI one here.
/usr/bin/python3 -c 'import Milter' >/dev/null 2>&1 || missing+=(python3-milter)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1; then
  sudo=(sudo)
else
  echo "installing ${missing[*]} needs root (or sudo)" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
# No service starts during the install (Debian's policy-rc.d: 101 means
# "action forbidden"), in case a main.cf from before makes postinst try.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
  "${sudo[@]}" chmod +x "$policy"
  trap '"${sudo[@]}" rm -f "$policy"' EXIT
fi
echo 'postfix postfix/main_mailer_type select No configuration' |
  "${sudo[@]}" debconf-set-selections
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq "${missing[@]}"

for program in postconf smtp-sink miltertest; do
  command -v "$program" >/dev/null 2>&1 ||
    { echo "$program still missing after apt-get install" >&2; exit 1; }
done
