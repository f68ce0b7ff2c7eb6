#!/usr/bin/env bash
# Builds real Kubernetes binaries from the Go module proxy, once, into a cache
# outside the repository. Usage: build-k8s.sh [BINARY ...]
# (default: kube-apiserver kubectl; the full cluster also wants
#  kube-controller-manager kube-scheduler kubelet).
#
# Why v1.33: its kubelet still runs on cgroup v1 hosts with only a warning
# (1.35+ refuses unless failCgroupV1=false) and still talks to containerd 1.6
# (Debian bookworm's); and every one of its staging modules is published at
# the matching v0.33.x tag (some v0.32.x patch tags are not).
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.33.13}"
CACHE="${CKPTDRAIN_CACHE:-$HOME/.cache/ckptdrain}"
OUT="$CACHE/k8s/$K8S_VERSION/bin"
SRC="$CACHE/k8s/$K8S_VERSION/module"
binaries=("$@")
[ ${#binaries[@]} -gt 0 ] || binaries=(kube-apiserver kubectl)

mkdir -p "$OUT" "$SRC"

# A binary counts as built only if it reports the pinned version: without the
# -X flags below, a module build says v0.0.0-master, which breaks helm's
# kubeVersion checks and version-skew logic (older caches hold such builds).
reports_version() {
  case "$1" in
    kubectl) "$OUT/$1" version --client 2>/dev/null ;;
    *) "$OUT/$1" --version 2>/dev/null ;;
  esac | grep -qF "$K8S_VERSION"
}
missing=()
for b in "${binaries[@]}"; do { [ -x "$OUT/$b" ] && reports_version "$b"; } || missing+=("$b"); done
[ ${#missing[@]} -gt 0 ] || { echo "$OUT"; exit 0; }

# One build at a time per version (tests and scripts may call this at once).
exec 9>"$CACHE/k8s/$K8S_VERSION/.build.lock"
flock 9
missing=()
for b in "${binaries[@]}"; do { [ -x "$OUT/$b" ] && reports_version "$b"; } || missing+=("$b"); done
[ ${#missing[@]} -gt 0 ] || { echo "$OUT"; exit 0; }

# k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them
# with local paths, so it cannot be `go install`ed directly. A throwaway
# module requires it and points every staging module at its published tag.
staging_version="v0${K8S_VERSION#v1}"
cd "$SRC"
if [ ! -f go.mod ]; then
  cat > go.mod <<MOD
module ckptdrain.local/k8sbuild

go 1.24.0

require k8s.io/kubernetes $K8S_VERSION
MOD
  modfile=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  {
    echo "replace ("
    grep -oE 'k8s\.io/[a-z0-9-]+ => \./staging/src/k8s\.io/[a-z0-9-]+' "$modfile" \
      | awk -v v="$staging_version" '{print "\t" $1 " => " $1 " " v}'
    echo ")"
  } >> go.mod
  cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  GOFLAGS=-mod=mod go mod tidy >/dev/null 2>&1 || GOFLAGS=-mod=mod go mod tidy
fi

# What hack/lib/version.sh stamps into a release build (no git commit: the
# module zip has no history).
minor="${K8S_VERSION#v*.}"
version_ldflags=""
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  version_ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=${minor%%.*} -X $pkg.gitTreeState=clean"
done

for b in "${missing[@]}"; do
  echo "building $b $K8S_VERSION (cached in $OUT)" >&2
  CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w$version_ldflags" -o "$OUT/$b.tmp" "k8s.io/kubernetes/cmd/$b"
  mv "$OUT/$b.tmp" "$OUT/$b"
done
echo "$OUT"
