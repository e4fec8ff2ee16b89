#!/usr/bin/env bash
# SpamAssassin (Mail::SpamAssassin and Debian's spamd) and spamc, from
# Debian. clients/perl/forkpool-spamd hosts SpamAssassin on forkpool; its
# tests (crates/forkpool-cli/tests/spamd.rs) drive it with the real spamc
# and compare its answers with Debian's spamd, and bench/spamd.sh measures
# the two side by side.
set -euo pipefail
. "$(dirname "$0")/../lib/apt-install.sh"

missing=()
perl -MMail::SpamAssassin -e1 >/dev/null 2>&1 || missing+=(spamassassin)
[ -x /usr/sbin/spamd ] || missing+=(spamd)
command -v spamc >/dev/null 2>&1 || missing+=(spamc)
[ ${#missing[@]} -eq 0 ] && exit 0

apt_install "${missing[@]}"
# Debian may start spamd on install: the tests start their own.
[ -x /etc/init.d/spamd ] && { /etc/init.d/spamd stop >/dev/null 2>&1 || true; }
exit 0
