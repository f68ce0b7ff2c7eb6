#!/usr/bin/env bash
# Builds helm and kubeconform from the Go module proxy, once, into
# $CACHE/tools/bin, and prints that directory. No release downloads: only the
# Go module proxy is reachable here.
#
# Pins: helm v3.20.2 (needs Go >= 1.25; the machine has 1.26) and kubeconform
# v0.7.0. Bump them together with a look at `go version`.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.20.2}"
# helm's own Makefile stamps the Kubernetes version it was built against from
# its client-go (v0.35 → 1.35). Without it `helm template` reports KubeVersion
# v1.20 to charts, and `helm lint` checks deprecations against 1.20.
HELM_K8S_MAJOR="${HELM_K8S_MAJOR:-1}"
HELM_K8S_MINOR="${HELM_K8S_MINOR:-35}"
KUBECONFORM_VERSION="${KUBECONFORM_VERSION:-v0.7.0}"

CACHE="${CKPTDRAIN_CACHE:-$HOME/.cache/ckptdrain}"
BIN="$CACHE/tools/bin"
mkdir -p "$BIN"

# The versioned stamp files make a pin bump rebuild instead of silently
# keeping the old binary.
need() { [ -x "$BIN/$1" ] && [ -f "$BIN/.$1-$2" ] && return 1 || return 0; }

export GOBIN="$BIN" CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false} -trimpath"

if need helm "$HELM_VERSION"; then
  ldflags="-w -s"
  ldflags+=" -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  for pkg in pkg/lint/rules pkg/chartutil; do
    ldflags+=" -X helm.sh/helm/v3/$pkg.k8sVersionMajor=$HELM_K8S_MAJOR"
    ldflags+=" -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$HELM_K8S_MINOR"
  done
  echo "building helm $HELM_VERSION (a few minutes on 2 cores)" >&2
  go install -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  rm -f "$BIN"/.helm-*
  touch "$BIN/.helm-$HELM_VERSION"
fi

if need kubeconform "$KUBECONFORM_VERSION"; then
  echo "building kubeconform $KUBECONFORM_VERSION" >&2
  go install -ldflags "-w -s -X main.version=$KUBECONFORM_VERSION" \
    "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION"
  rm -f "$BIN"/.kubeconform-*
  touch "$BIN/.kubeconform-$KUBECONFORM_VERSION"
fi

echo "$BIN"
