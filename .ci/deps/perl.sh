#!/usr/bin/env bash
# Plack (the PSGI toolkit), Starman (the PSGI server forkpool's PSGI server
# is measured against) and wrk (the load generator), from Debian. The
# tests of clients/perl/forkpool-psgi serve a real Plack app; the server
# itself needs only core Perl. Plack's own server test suite runs against
# it too.
set -euo pipefail

missing=()
perl -MPlack -e1 >/dev/null 2>&1 || missing+=(libplack-perl)
# Plack::Test::Suite (tests/psgi_plack_suite.rs) starts servers with Test::TCP.
perl -MTest::TCP -e1 >/dev/null 2>&1 || missing+=(libtest-tcp-perl)
command -v starman >/dev/null 2>&1 || missing+=(starman)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  sudo=sudo
else
  sudo=
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq "${missing[@]}"
