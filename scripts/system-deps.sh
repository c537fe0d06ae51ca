#!/usr/bin/env bash
# Debian packages the tests need: PortAudio (sounddevice), chromium (browser tests), HAProxy (scale-out test).
# Installs only what is missing; needs root (CI and dev machines run as root).
set -euo pipefail
need=()
dpkg -s libportaudio2 >/dev/null 2>&1 || need+=(libportaudio2)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v haproxy >/dev/null 2>&1 || need+=(haproxy)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "missing Debian packages: ${need[*]} (run: sudo apt-get install ${need[*]})" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
