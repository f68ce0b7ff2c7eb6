#!/usr/bin/env bash
# Builds a kubernetes-sigs workload controller for the e2e cluster, once,
# from the Go module proxy by module name, into a one-binary OCI image that
# e2e/cluster/load-images.sh --oci imports. Prints, for `eval`:
#   IMAGE=localhost/ckptdrain/jobset:v0.9.1 ARCHIVE=<oci tar> CHART=<its Helm chart>
#
#   jobset.sh [jobset]   sigs.k8s.io/jobset, the JobSet controller and webhooks
#   jobset.sh lws        sigs.k8s.io/lws, LeaderWorkerSet
#   jobset.sh kueue      sigs.k8s.io/kueue, the Kueue controller and webhooks
#
# Versions follow the cluster's Kubernetes (v1.33, e2e/cluster/lib.sh): the
# release whose go.mod builds against k8s.io/* v0.33 — JobSet v0.9.1
# (client-go v0.33.4, controller-runtime v0.21), LWS v0.7.0 (v0.33.3,
# v0.21), Kueue v0.13.5 (v0.33.3, v0.21; the newest v0.13 the proxy serves:
# v0.13.0, .1, .3, .4, .6-.8 answer 403). Later releases move to 0.34+
# (Kueue v0.14.0 to 0.34.1) and newer API behaviour.
#
# The proxy serves these versions but the checksum database has no entry
# for them (sum.golang.org answers 404) and `@v/list` is refused, so
# `go install module@version` cannot be used. Instead the module zip is
# fetched with checksum verification off for this one module, its h1: hash
# is compared with the one pinned here, and the manager is built inside the
# module's own directory, so its go.sum verifies every dependency.
#
# The image is the manager alone at /manager (what both upstream charts
# run), user 65532 (their charts demand runAsNonRoot). A cold build takes
# several minutes on 2 cores; later runs print at once.
set -euo pipefail

which="${1:-jobset}"
case "$which" in
  jobset)
    module=sigs.k8s.io/jobset version="${JOBSET_VERSION:-v0.9.1}" pkg=.
    sum="h1:0VWakCej3FuYFxsoTrMEibosO9PjpxgawT+U146dgjM=" chart=charts/jobset ;;
  lws)
    module=sigs.k8s.io/lws version="${LWS_VERSION:-v0.7.0}" pkg=./cmd
    sum="h1:qWfzX8+UBak+Hq0+m/PuE3uO0mp/3dmm5q/h/7z31A8=" chart=charts/lws ;;
  kueue)
    module=sigs.k8s.io/kueue version="${KUEUE_VERSION:-v0.13.5}" pkg=./cmd/kueue
    sum="h1:VaGeigsjCt4sxeWJWiygMTQib4Lf2PJxk3wCsmHWkb0=" chart=charts/kueue ;;
  *) echo "jobset.sh: unknown controller $which (jobset, lws or kueue)" >&2; exit 2 ;;
esac
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${CKPTDRAIN_CACHE:-$HOME/.cache/ckptdrain}"
OUT="$CACHE/$which/$version"
image="localhost/ckptdrain/$which:$version"
archive="$OUT/$which.oci.tar"
mkdir -p "$OUT"

# The module directory (read-only, in Go's module cache): where the chart is.
module_dir() {
  local json
  json="$(GONOSUMDB="$module" go mod download -json "$module@$version")" || {
    echo "jobset.sh: go mod download $module@$version failed: $json" >&2; exit 1; }
  local got dir
  got="$(printf '%s' "$json" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Sum",""))')"
  dir="$(printf '%s' "$json" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir",""))')"
  # Only the pinned version's hash is known; another version is taken as served.
  if [ "$version" = "$(default_version)" ] && [ "$got" != "$sum" ]; then
    echo "jobset.sh: $module@$version hashes to $got, expected $sum" >&2; exit 1
  fi
  [ -d "$dir" ] || { echo "jobset.sh: no module directory for $module@$version" >&2; exit 1; }
  echo "$dir"
}
default_version() { case "$which" in jobset) echo v0.9.1 ;; lws) echo v0.7.0 ;; kueue) echo v0.13.5 ;; esac; }

# Rebuilt when this script or the image writer changes.
stamp="$(cat "${BASH_SOURCE[0]}" "$here/../images/oci.py" | sha256sum | cut -c1-16)"
built() { [ -s "$archive" ] && [ "$(cat "$archive.stamp" 2>/dev/null)" = "$stamp" ]; }
if ! built; then
  exec 9>"$OUT/.build.lock"
  flock 9
  if ! built; then
    dir="$(module_dir)"
    echo "building $module@$version (cached in $OUT)" >&2
    t0=$SECONDS
    # Inside the module: its go.mod (no replace directives in these three) and
    # go.sum decide every dependency. CGO off: a static binary, nothing else
    # in the image.
    (cd "$dir" && CGO_ENABLED=0 GONOSUMDB="$module" go build -trimpath -ldflags "-s -w" \
      -o "$OUT/manager.tmp" "$pkg")
    mv "$OUT/manager.tmp" "$OUT/manager"
    echo "built $module@$version in $((SECONDS - t0))s" >&2
    python3 "$here/../images/oci.py" --binary "$OUT/manager" --path /manager \
      --name "$image" --out "$archive" --user 65532:65532 --created-by "e2e/deps/jobset.sh"
    echo "$stamp" >"$archive.stamp"
  fi
fi
echo "IMAGE=$image ARCHIVE=$archive CHART=$(module_dir)/$chart"
