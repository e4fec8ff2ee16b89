#!/usr/bin/env bash
# Sourced by .ci/deps/*.sh: `apt_install PACKAGE...` installs Debian
# packages as root or through sudo, first from the index the machine has
# (quick), then after an `apt-get update` if that fails.
apt_install() {
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "installing $* needs root (or sudo)" >&2; return 1; }
    sudo=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  if ! "${sudo[@]}" apt-get install -y -qq --no-install-recommends "$@"; then
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends "$@"
  fi
}
