#!/usr/bin/env bash
# A second milter client nobody here wrote, for what Debian's miltertest
# cannot check (a changed sender, a recipient added with ESMTP arguments,
# a replacement body of several 64 KiB chunks): PyPI's `miltertest`, pure
# Python, pinned, in a virtual environment at target/miltertest-venv.
# Used by crates/forkpool-milter/tests/miltertest_every_modification.rs.
# Idempotent: quick when it is already there.
set -euo pipefail
cd "$(dirname "$0")/../.."

MILTERTEST=1.0.0
VENV=target/miltertest-venv

if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq python3-venv
fi

want="miltertest==$MILTERTEST"
stamp="$VENV/.forkpool-pins"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "$want"
echo "$want" >"$stamp"
