#!/usr/bin/env bash
# Build .devcarry/site/ (git-ignored): the pure-Python / abi3 packages a TTS-only voxloop server
# (server.stages=tts) needs on the lent GPU box, a Python 3.12 host that has only torch, numpy, onnx
# and onnxruntime and cannot reach PyPI. Use it there with PYTHONPATH="$PWD/.devcarry/site:$PWD".
#
# Wheels (versions pinned in pyproject.toml) are downloaded for CPython 3.12 / manylinux x86_64
# and unzipped: websockets, prometheus-client, webrtcvad-wheels, soxr, and piper-tts slimmed from
# ~46 MB unpacked to its espeak-ng bridge + the data English and Mandarin need: the 34 MB wheel
# is mostly piper/hebrew (nakdimon.onnx), piper/tashkeel and ~100 espeak-ng *_dict files, none of
# which voxloop's front end uses (it loads piper/espeakbridge*.so directly and never imports
# piper's Python code, tts_engine/frontend.py).
#
# Then checks, with this machine's venv: the slim piper phonemizes English and Mandarin to the
# same ids as the full install (tts_engine.frontend.TextFrontend), and, when PY312 names a Python
# 3.12 interpreter, that every package in the site imports there. Prints the sizes.
#
# Env: PY (python with pip, default .venv/bin/python), DICTS (espeak dictionaries kept, default
# "en cmn"; cmn_dict alone is 1.5 MB), PY312 (optional 3.12 interpreter for the import check).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PY=${PY:-$ROOT/.venv/bin/python}
DICTS=${DICTS:-en cmn}
SITE=$ROOT/.devcarry/site
WHEELS=$(mktemp -d)
trap 'rm -rf "$WHEELS"' EXIT
export PYTHONDONTWRITEBYTECODE=1 # checks below must not leave __pycache__ in the site

pin() { # the exact requirement pinned in pyproject.toml, e.g. websockets==17.4
	local spec
	spec=$(grep -oE "\"$1==[^\"]+\"" pyproject.toml | tr -d '"')
	[ -n "$spec" ] || { echo "devcarry: $1 is not pinned in pyproject.toml" >&2; exit 1; }
	echo "$spec"
}

# pip matches --platform tags exactly (no older-glibc expansion): list both manylinux generations.
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	--platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d "$WHEELS" \
	"$(pin websockets)" "$(pin prometheus-client)" "$(pin webrtcvad-wheels)" "$(pin soxr)" "$(pin piper-tts)"

rm -rf "$SITE"
mkdir -p "$SITE"
for whl in "$WHEELS"/*.whl; do
	echo "  $(basename "$whl") ($(du -k "$whl" | cut -f1) KiB)"
	"$PY" -m zipfile -e "$whl" "$SITE"
done
# Files a wheel keeps under <name>.data/{purelib,platlib} belong in site-packages itself.
for data in "$SITE"/*.data; do
	[ -d "$data" ] || continue
	for lib in purelib platlib; do
		[ -d "$data/$lib" ] && cp -r "$data/$lib/." "$SITE/"
	done
	rm -rf "$data"
done

# Every byte counts: voice + site must fit a run's 64 MiB carry. websockets/trio is an optional
# backend voxloop does not use.
rm -rf "$SITE/websockets/trio"

# Slim piper: voxloop only finds the package (importlib.util.find_spec, so __init__.py stays, never
# executed) and loads espeakbridge*.so itself; none of piper's Python code runs. Kept: __init__.py,
# the bridge, espeak-ng's phoneme data, languages and the kept dictionaries. The RECORD would list
# files no longer there.
PIPER=$SITE/piper
find "$PIPER" -mindepth 1 -maxdepth 1 ! -name __init__.py ! -name 'espeakbridge*' ! -name espeak-ng-data \
	-exec rm -rf {} +
rm -f "$PIPER/espeakbridge.pyi" "$PIPER/espeak-ng-data/phondata-manifest" "$SITE"/piper_tts-*.dist-info/RECORD
keep=()
for d in $DICTS; do
	[ -f "$PIPER/espeak-ng-data/${d}_dict" ] || { echo "devcarry: no espeak-ng dictionary ${d}_dict" >&2; exit 1; }
	keep+=("${d}_dict")
done
for f in "$PIPER"/espeak-ng-data/*_dict; do
	[[ " ${keep[*]} " == *" $(basename "$f") "* ]] || rm -f "$f"
done
for f in espeakbridge.so espeak-ng-data/phondata espeak-ng-data/phonindex espeak-ng-data/phontab \
	espeak-ng-data/intonations espeak-ng-data/lang espeak-ng-data/voices; do
	compgen -G "$PIPER/${f%.so}*" >/dev/null || { echo "devcarry: piper wheel lacks $f" >&2; exit 1; }
done

# The slim piper must phonemize exactly as the full install does.
"$PY" - "$SITE" <<'EOF'
import subprocess, sys, json

site = sys.argv[1]
probe = r'''
import json, sys
site = sys.argv[1]
if site:
    sys.path.insert(0, site)
from tts_engine.frontend import TextFrontend, piper_package_dir
from tts_engine.voice import VoiceConfig
from voxloop.config import load_config
from voxloop import models

cfg = load_config(None, [], environ={})
voice = models.resolve_voice(cfg).path
config = VoiceConfig.load(models.voice_config_path(cfg, voice))
text = "Dr. Smith paid $3.50 for 2 coffees on Jan. 5th; the weather's fine, isn't it?"
ids = [list(s) for s in TextFrontend(config).sentence_ids(text)]
print(json.dumps({"piper": str(piper_package_dir()), "ids": ids}))
'''
run = lambda s: json.loads(subprocess.run([sys.executable, "-c", probe, s], check=True, capture_output=True,
                                          text=True).stdout.splitlines()[-1])
slim, full = run(site), run("")
assert slim["piper"].startswith(site), f"the slim run used {slim['piper']}"
assert not full["piper"].startswith(site)
assert slim["ids"] == full["ids"] and slim["ids"], "slim piper phonemizes differently"
print(f"  English ids equal to the full install ({sum(map(len, slim['ids']))} ids; {full['piper']})")
EOF
if [[ " $DICTS " == *" cmn "* ]]; then
	"$PY" - "$SITE" <<'EOF'
import subprocess, sys

probe = r'''
import sys
if sys.argv[1]:
    sys.path.insert(0, sys.argv[1])
from tts_engine.frontend import EspeakPhonemizer
print("".join("".join(s) for s in EspeakPhonemizer("cmn").phonemize("你好，今天天气很好。")))
'''
run = lambda s: subprocess.run([sys.executable, "-c", probe, s], check=True, capture_output=True, text=True).stdout
slim, full = run(sys.argv[1]), run("")
assert slim == full and slim.strip(), (slim, full)
print(f"  Mandarin (espeak cmn) phonemes equal to the full install: {slim.strip()}")
EOF
fi

if [ -n "${PY312:-}" ]; then
	"$PY312" -c "
import sys; sys.path.insert(0, '$SITE')
import websockets, prometheus_client, webrtcvad, soxr, numpy
for m in (websockets, prometheus_client, webrtcvad, soxr):
    assert m.__file__.startswith('$SITE'), m.__file__
print('  imports under', sys.version.split()[0], 'ok: websockets', websockets.__version__, '/ soxr', soxr.__version__)
"
fi

find "$SITE" -name __pycache__ -prune -exec rm -rf {} +
echo "site: $(du -sh "$SITE" | cut -f1) on disk, $(du -sb "$SITE" | cut -f1) bytes"
du -sb "$SITE"/* | sort -n | awk '{printf "  %8.0f KiB  %s\n", $1 / 1024, $2}' | sed "s|$SITE/||"
echo "piper kept: $(cd "$PIPER" && du -sb espeakbridge*.so espeak-ng-data/* | awk '{printf "%s %.0fK, ", $2, $1 / 1024}')"
# A run carries 64 MiB at most: the voice (.onnx + .json) and this site must fit together.
carry=$(du -cb "$SITE" "$ROOT"/.devcarry/*.onnx "$ROOT"/.devcarry/*.onnx.json 2>/dev/null | tail -1 | cut -f1)
limit=$((64 * 1048576))
echo "voice + site: $carry bytes, $(((limit - carry) / 1024)) KiB under the 64 MiB carry limit" |
	sed "s/ -\([0-9]*\) KiB under/ \1 KiB OVER/"
if [ "$carry" -gt "$limit" ]; then
	echo "devcarry: WARNING: voice + site exceed a run's 64 MiB carry; DICTS=en drops cmn_dict (1.5 MB)" >&2
fi
