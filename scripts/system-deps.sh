#!/usr/bin/env bash
# Debian packages the tests need: PortAudio (sounddevice), chromium (browser tests), HAProxy (scale-out test),
# alsa-utils (its recordings of a human voice: VAD tests and bench/turn_taking.py).
# Installs only what is missing (scripts/apt-install-missing.sh).
set -euo pipefail
need=()
dpkg -s libportaudio2 >/dev/null 2>&1 || need+=(libportaudio2)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v haproxy >/dev/null 2>&1 || need+=(haproxy)
[ -f /usr/share/sounds/alsa/Front_Center.wav ] || need+=(alsa-utils)
bash "$(dirname "$0")/apt-install-missing.sh" ${need[@]+"${need[@]}"}
