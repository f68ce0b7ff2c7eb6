#!/usr/bin/env bash
# Builds the ckptdrain image offline: wheels on the host (the host reaches
# PyPI; containers here cannot), a build context holding only those wheels,
# `docker build` on the local base image from base.sh, then a smoke test as
# the pods run it (non-root, read-only root filesystem) and the image size.
#
# Usage: e2e/image/build.sh           prints the image name
# Env:   IMAGE (default ckptdrain:dev), BASE_IMAGE (default: built by
#        base.sh), PYTHON (a CPython 3.11 to build wheels with), CKPTDRAIN_CACHE
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
IMAGE="${IMAGE:-ckptdrain:dev}"
CACHE="${CKPTDRAIN_CACHE:-$HOME/.cache/ckptdrain}"
CTX="$CACHE/image/context"

log() { echo "build.sh: $*" >&2; }

if [ -z "${BASE_IMAGE:-}" ]; then
  BASE_IMAGE=$("$here/base.sh")
fi

# The wheels must match the image's CPython 3.11 (compiled deps such as
# google-crc32c and PyYAML ship per-version wheels).
PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
  for p in "$repo/.venv/bin/python" python3.11 python3; do
    if command -v "$p" >/dev/null \
       && "$p" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      PYTHON=$p; break
    fi
  done
fi
[ -n "$PYTHON" ] || { log "need a CPython 3.11 to build wheels (set PYTHON=)"; exit 1; }

start=$(date +%s)
# The CSI driver's gRPC stubs are generated code, not in git: they must be in
# the package before its wheel is built (the build inside docker has no
# network to fetch the protos).
# The repo's venv has grpcio-tools (make venv); $PYTHON, picked for its
# version, may not. Current stubs need neither.
stubs_python="$PYTHON"
[ -x "$repo/.venv/bin/python" ] && stubs_python="$repo/.venv/bin/python"
"$repo/e2e/deps/csi-stubs.sh" "$stubs_python"
# A fresh context every time: a stale ckptdrain wheel of the same version
# would otherwise win. Dependency wheels come from pip's own cache (under
# $CACHE), so rebuilding is cheap.
rm -rf "$CTX"
mkdir -p "$CTX/wheels"
log "building wheels with $PYTHON into $CTX/wheels"
PIP_CACHE_DIR="$CACHE/pip" "$PYTHON" -m pip wheel -q --disable-pip-version-check \
  --wheel-dir "$CTX/wheels" "$repo"
cp "$repo/Dockerfile" "$CTX/Dockerfile"

log "docker build $IMAGE on $BASE_IMAGE"
. "$here/build-replacing.sh"
build_replacing "$IMAGE" --build-arg BASE_IMAGE="$BASE_IMAGE" "$CTX"

# Smoke test exactly as pods run it: uid 65532, read-only root, no /tmp.
version=$(docker run --rm --read-only --user 65532 "$IMAGE" --version)
size=$(docker image inspect -f '{{.Size}}' "$IMAGE")
base_size=$(docker image inspect -f '{{.Size}}' "$BASE_IMAGE")
log "smoke test: ckptdrain --version → $version"
log "image $IMAGE: $((size / 1000000)) MB (base $BASE_IMAGE: $((base_size / 1000000)) MB)"
log "built in $(( $(date +%s) - start ))s"
echo "$IMAGE"
