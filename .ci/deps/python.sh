#!/usr/bin/env bash
# Python side of the WSGI tests and benchmark: a virtual environment at
# target/py-venv with pinned Flask and gunicorn (PyPI), and wrk (Debian).
# Idempotent: quick when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/../.."

FLASK=3.1.3
GUNICORN=23.0.0
VENV=target/py-venv

if ! command -v wrk >/dev/null 2>&1 || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq wrk python3-venv
fi

want="flask==$FLASK gunicorn==$GUNICORN"
stamp="$VENV/.forkpool-pins"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check $want
echo "$want" >"$stamp"
