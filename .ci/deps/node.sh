#!/usr/bin/env bash
# Node.js and npm for clients/node (tests/node.rs runs its worker helper
# and packs it with `npm pack`): the machine's own when there is one,
# else Debian's. Idempotent: quick when both are there.
set -euo pipefail
. "$(dirname "$0")/../lib/apt-install.sh"

missing=()
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
[ ${#missing[@]} -eq 0 ] && exit 0
apt_install "${missing[@]}"
