#!/usr/bin/env bash
# One node of the e2e cluster on this host (run by up.sh, for node a and,
# with E2E_NODE=b, for node b; lib.sh holds each node's names, addresses and
# state directory). Usage:
#   node.sh bridge   the node's CNI bridge, with the node's address on it
#   node.sh start    its containerd (own config, state, socket and runc
#                    root), the pause image, its CNI config and its kubelet
#                    (own root dir, cgroup root and pod log directory)
#   node.sh stop-kubelet, node.sh start-kubelet
#                    its kubelet alone, stopped and started again with the
#                    flags, config and environment `start` gave it (a
#                    kubelet restart); stop-kubelet fails unless kubelet
#                    ran and its health endpoint refuses once it stopped
# Idempotent: what runs is kept. down.sh stops both nodes.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

case "${1:-}" in
  bridge)
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
      log "creating bridge $BRIDGE $NODE_IP/${POD_CIDR#*/}"
      ip link add "$BRIDGE" type bridge
    fi
    ip addr replace "$NODE_IP/${POD_CIDR#*/}" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    ;;
  start)
    mkdir -p "$STATE"/{run,logs,kubelet,cni/net.d,cni/ipam,containerd}
    if [ "${E2E_NODE:-a}" = b ]; then
      "$E2E_CLUSTER_DIR/pki.sh"
      cp "$(dirname "$STATE")/resolv.conf" "$STATE/resolv.conf"
      mkdir -p "$POD_LOGS_DIR"
      # The kubelet refuses a cgroup root that does not exist. A new v1
      # cpuset starts with no CPUs and no memory nodes: give it the host's.
      for hierarchy in /sys/fs/cgroup/*/; do
        dir="$hierarchy${CGROUP_ROOT#/}"
        mkdir -p "$dir"
        for f in cpuset.cpus cpuset.mems; do
          if [ -f "$dir/$f" ] && [ -z "$(cat "$dir/$f")" ]; then
            cat "$hierarchy$f" >"$dir/$f"
          fi
        done
      done
    fi
    PAUSE_ARCHIVE="$("$E2E_REPO_ROOT/e2e/images/pause/build.sh")"
    render "$E2E_CLUSTER_DIR/containerd.toml" >"$STATE/containerd/config.toml"
    render "$E2E_CLUSTER_DIR/10-ckptdrain.conflist" >"$STATE/cni/net.d/10-ckptdrain.conflist"
    start_daemon containerd containerd --config "$STATE/containerd/config.toml"
    wait_for 60 containerd actl version
    if ! actl images ls -q | grep -qxF "$PAUSE_IMAGE"; then
      log "importing $PAUSE_IMAGE into $NODE_NAME"
      actl images import "$PAUSE_ARCHIVE" >/dev/null
    fi
    render "$E2E_CLUSTER_DIR/kubelet.yaml" >"$STATE/kubelet/config.yaml"
    if [ "${E2E_NODE:-a}" = b ]; then
      # Only pods that tolerate it land on node b.
      printf 'registerWithTaints:\n- {key: %s, value: "true", effect: NoSchedule}\n' \
        "$NODE_B_TAINT" >>"$STATE/kubelet/config.yaml"
    fi
    start_kubelet
    ;;
  stop-kubelet)
    # The node's pods keep running under containerd while kubelet is away
    # (shutdownGracePeriod is 0: kubelet stops without draining anything).
    running kubelet || die "kubelet of $NODE_NAME is not running: nothing to stop"
    # Its environment as `start` gave it, for start-kubelet: whoever asks
    # for the restart has its own (PATH, E2E_*), not the cluster's.
    cp "/proc/$(cat "$(pidfile kubelet)")/environ" "$STATE/run/kubelet.environ"
    stop_daemon kubelet 20
    ! curl -sf --max-time 2 "http://127.0.0.1:$KUBELET_HEALTHZ_PORT/healthz" >/dev/null 2>&1 \
      || die "kubelet of $NODE_NAME stopped, yet its health endpoint still answers"
    ;;
  start-kubelet)
    if [ -f "$STATE/run/kubelet.environ" ]; then
      mapfile -d '' -t environment <"$STATE/run/kubelet.environ"
      start_kubelet env -i "${environment[@]}"
    else
      start_kubelet
    fi
    ;;
  *)
    die "usage: node.sh bridge|start|stop-kubelet|start-kubelet"
    ;;
esac
