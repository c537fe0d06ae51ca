#!/usr/bin/env bash
# Install the given Debian packages (if any): used by system-deps.sh and docker-deps.sh,
# which decide what is missing. Needs root (CI and dev machines run as root).
set -euo pipefail
[ $# -gt 0 ] || exit 0
if [ "$(id -u)" != 0 ]; then
  echo "missing Debian packages: $* (run: sudo apt-get install $*)" >&2
  exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
