#!/usr/bin/env bash
# `make e2e`: the whole scenario of issue 6 on a real two-node cluster,
# offline. Cluster up, images built and loaded, then the scenario driver
# (e2e/scenario/scenario.py: helm install, S3, policy, Job, SIGTERM, restore
# from each tier, uninstall), then the cluster down — also on failure, unless
# KEEP=1. The report lands in $CACHE/e2e/report.md (and is printed).
#
#   e2e/run.sh            the full scenario with a real PyTorch trainer, the
#                         JobSet, LeaderWorkerSet, Kueue and chaos steps
#   e2e/run.sh --short    CI's scenario (`make e2e-short`): the simulated
#                         trainer from the project image, no torch, fewer
#                         waits; the JobSet step, no LWS or chaos step
#
# The JobSet controller (and, full run only, LeaderWorkerSet and Kueue) is built from
# the Go module proxy (e2e/deps/jobset.sh, cached; several minutes each the
# first time) while the cluster starts.
#
# Needs root (bridge, iptables, the node's local tier). Installs what the host
# lacks from Debian (e2e/deps/host.sh). Env: CKPTDRAIN_CACHE, KEEP=1 (leave
# the cluster up), PYTHON (default .venv/bin/python), E2E_ONLY=dcp (full run
# only), E2E_ONLY=csi or kueue (full run only: the CSI node driver on the real
# kubelet, e2e/scenario/csi.py; Kueue's preemption, e2e/scenario/kueue.py;
# both run the simulated trainer, so no torch, trainer image or
# LeaderWorkerSet), E2E_ONLY=peer, agreement, processes, move or jobset:
# install, S3 and that step alone, then uninstall.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
CACHE="${CKPTDRAIN_CACHE:-$HOME/.cache/ckptdrain}"
export CKPTDRAIN_CACHE="$CACHE"
PYTHON="${PYTHON:-$repo/.venv/bin/python}"
started=$(date +%s)
log() { echo "e2e: [$(( $(date +%s) - started ))s] $*" >&2; }

short=false trainer_image=false
case "${1:-}" in
  --short) short=true ;;
  "") ;;
  *) echo "usage: e2e/run.sh [--short]" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "e2e: run as root (the cluster needs it)" >&2; exit 1; }
[ -x "$PYTHON" ] || { echo "e2e: no $PYTHON (make venv)" >&2; exit 1; }
"$repo/e2e/deps/host.sh"

# torch for the trainer, from this interpreter's installation (read-only hostPath;
# see e2e/images/trainer/Dockerfile for why it is not in the image).
torch_site() {
  # numpy too: torch.distributed's object collectives (DCP) need it, and torch
  # installs without it.
  "$PYTHON" -c 'import os, numpy, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null
}
WORK="$CACHE/e2e"
# The CSI and Kueue steps alone need only the project image (their trainer is
# simulated).
sim_only=false
case "${E2E_ONLY:-}" in csi|kueue) $short || sim_only=true ;; esac
if $short; then
  WORK="$CACHE/e2e-short"
  scenario_args=(--short)
  [ -n "${E2E_ONLY:-}" ] && scenario_args+=(--only "$E2E_ONLY")
  images=(ckptdrain:dev)
elif $sim_only; then
  scenario_args=(--only "$E2E_ONLY")
  images=(ckptdrain:dev)
else
  if ! TORCH_SITE=$(torch_site); then
    log "installing the project's torch extra into $PYTHON's environment (a large download, once)"
    "$PYTHON" -m pip install -q 'torch>=2.2' numpy >&2   # pyproject's torch extra
    TORCH_SITE=$(torch_site) || { echo "e2e: $PYTHON still cannot import torch and numpy" >&2; exit 1; }
  fi
  scenario_args=(--torch-site "$TORCH_SITE" --chaos --dcp)
  [ -n "${E2E_ONLY:-}" ] && scenario_args+=(--only "$E2E_ONLY")
  images=(ckptdrain:dev ckptdrain-trainer:dev)
  trainer_image=true
fi

down() {
  if [ "${KEEP:-0}" = 1 ]; then log "KEEP=1: cluster left up"; return; fi
  log "cluster down"
  "$here/cluster/down.sh" >&2 || log "down.sh reported leftovers"
}

mkdir -p "$WORK"
# The images build while the cluster starts (Docker's side and the cluster's
# containerd are separate; on a warm machine both take seconds to a minute).
log "cluster up; images building meanwhile (log: $WORK/images.log)"
{
  "$repo/e2e/image/build.sh" >/dev/null
  # The quickstart's MinIO, under the name its manifest pulls (docs/quickstart.md).
  "$here/images/minio/build.sh" >"$WORK/minio.image"
  $trainer_image && "$here/images/trainer/build.sh" >/dev/null
  "$here/deps/jobset.sh" >"$WORK/jobset.env"
  if ! $short; then
    $sim_only || "$here/deps/jobset.sh" lws >"$WORK/lws.env"
    [ "${E2E_ONLY:-}" = csi ] || "$here/deps/jobset.sh" kueue >"$WORK/kueue.env"
  fi
} >"$WORK/images.log" 2>&1 &
images_pid=$!
trap 'kill "$images_pid" 2>/dev/null || true' EXIT
eval "$("$here/cluster/up.sh")"
trap down EXIT
# kubectl from the cluster's build, helm from e2e/deps (both cached).
k8s_bin=$(. "$here/cluster/lib.sh" && echo "$K8S_BIN")
export PATH="$k8s_bin:$("$repo/e2e/deps/helm-tools.sh"):$PATH"

wait "$images_pid" || { cat "$WORK/images.log" >&2; log "image build failed"; exit 1; }
log "images built; loading them"
images+=("$(cat "$WORK/minio.image")")
"$here/cluster/load-images.sh" "${images[@]}" >&2
# Node b runs the peer tier's second writer: our images only.
E2E_NODE=b "$here/cluster/load-images.sh" "${images[@]}" >&2
# IMAGE, ARCHIVE, CHART of the JobSet controller (e2e/deps/jobset.sh).
eval "$(cat "$WORK/jobset.env")"
"$here/cluster/load-images.sh" --oci "$ARCHIVE" >&2
scenario_args+=(--jobset-chart "$CHART" --jobset-image "$IMAGE")
if ! $short; then
  if ! $sim_only; then
    # The same three for LeaderWorkerSet.
    eval "$(cat "$WORK/lws.env")"
    "$here/cluster/load-images.sh" --oci "$ARCHIVE" >&2
    scenario_args+=(--lws-chart "$CHART" --lws-image "$IMAGE")
  fi
  if [ "${E2E_ONLY:-}" != csi ]; then
    # And for Kueue (e2e/scenario/kueue.py).
    eval "$(cat "$WORK/kueue.env")"
    "$here/cluster/load-images.sh" --oci "$ARCHIVE" >&2
    scenario_args+=(--kueue-chart "$CHART" --kueue-image "$IMAGE")
  fi
fi

log "scenario"
set +e
"$PYTHON" "$here/scenario/scenario.py" --report "$WORK/report.md" --workdir "$WORK" \
  --allowed-root "$WORK/local" "${scenario_args[@]}"
rc=$?
set -e
log "scenario exited $rc after $(( $(date +%s) - started ))s (report: $WORK/report.md)"
trap - EXIT
if [ "${KEEP:-0}" != 1 ]; then
  log "cluster down"
  "$here/cluster/down.sh" >&2 || { log "down.sh found leftovers"; rc=1; }
fi
log "total $(( $(date +%s) - started ))s"
exit $rc
