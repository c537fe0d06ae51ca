#!/usr/bin/env bash
# Debian packages the image test needs: a Docker engine (docker.io: dockerd + a client with
# built-in BuildKit) and debootstrap (the test makes its own base image; no registry here).
# Installs only what is missing; needs root (CI and dev machines run as root).
set -euo pipefail
need=()
command -v dockerd >/dev/null 2>&1 && [ -x /usr/bin/docker ] || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "missing Debian packages: ${need[*]} (run: sudo apt-get install ${need[*]})" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
