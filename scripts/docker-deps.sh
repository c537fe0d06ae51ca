#!/usr/bin/env bash
# Debian packages the image test needs: a Docker engine (docker.io: dockerd + a client with
# built-in BuildKit) and debootstrap (the test makes its own base image; no registry here).
# Installs only what is missing (scripts/apt-install-missing.sh).
set -euo pipefail
need=()
command -v dockerd >/dev/null 2>&1 && [ -x /usr/bin/docker ] || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
bash "$(dirname "$0")/apt-install-missing.sh" ${need[@]+"${need[@]}"}
