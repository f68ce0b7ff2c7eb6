# Shared settings and helpers for up.sh, down.sh, smoke.sh and load-images.sh.
# Sourced, not run. Every path lives under one state directory in the cache,
# every listener is on loopback or on the cluster bridge, so two runs never
# collide with anything else on the machine.

CACHE="${CKPTDRAIN_CACHE:-$HOME/.cache/ckptdrain}"
# Pinned: see e2e/cluster/build-k8s.sh and e2e/README.md for why 1.33
# (cgroup v1 hosts and Debian bookworm's containerd 1.6).
K8S_VERSION="${K8S_VERSION:-v1.33.13}"
K8S_BIN="$CACHE/k8s/$K8S_VERSION/bin"
STATE="${CKPTDRAIN_CLUSTER_STATE:-$CACHE/cluster}"

NODE_NAME="ckptdrain-e2e"
# The node's address is the gateway of a bridge we create; the apiserver,
# the kubelet and the pods' default route all live on it, never on eth0.
BRIDGE="ckpt0"
BRIDGES="ckpt+"  # every node's bridge, as iptables spells a prefix
NODE_IP="10.244.0.1"
POD_CIDR="10.244.0.0/24"
# Every node's pods; kube-proxy treats traffic from outside it as external.
CLUSTER_CIDR="10.244.0.0/16"
# The control plane (apiserver, CoreDNS) lives on the first node's address.
API_IP="10.244.0.1"
SERVICE_CIDR="10.96.0.0/24"
API_SERVICE_IP="10.96.0.1"
CLUSTER_DOMAIN="cluster.local"

ETCD_PORT=23790
ETCD_PEER_PORT=23800
APISERVER_PORT=6443
KUBELET_PORT=10250
KUBELET_HEALTHZ_PORT=10248
KUBE_PROXY_HEALTHZ_PORT=10256
KUBE_PROXY_METRICS_PORT=10249
CONTROLLER_MANAGER_PORT=10257
SCHEDULER_PORT=10259
# CoreDNS serves on $NODE_IP:53 (the pods' nameserver); health/ready here.
COREDNS_HEALTH_PORT=10053
COREDNS_READY_PORT=10054

PAUSE_IMAGE="${PAUSE_IMAGE:-localhost/ckptdrain/pause:1.0}"
CONTAINERD_SOCK="$STATE/containerd/containerd.sock"
RUNC_ROOT="$STATE/containerd/runc"
CNI_BIN_DIR="/usr/lib/cni"
CNI_NETWORK="ckptdrain-e2e"
IPTABLES_CHAIN="CKPTDRAIN-E2E"
KUBECONFIG_ADMIN="$STATE/kubeconfig"

# Daemons in start order; down.sh stops them in reverse.
DAEMONS=(etcd kube-apiserver kube-controller-manager kube-scheduler coredns containerd kubelet kube-proxy)

# The kubelet's cgroup root and pod log directory (node b's are its own).
CGROUP_ROOT="/"
POD_LOGS_DIR="/var/log/pods"

# A second node on the same host, for what needs two (the peer tier): its
# own bridge and pod range, containerd, kubelet, cgroup root, pod logs and
# state under $STATE/node-b; the control plane, kube-proxy and CoreDNS stay
# the first node's. Tainted, so only pods that tolerate it land there. Every
# script acts on node b instead when E2E_NODE=b.
NODE_B_NAME="ckptdrain-e2e-b"
NODE_B_TAINT="ckptdrain.io/e2e-node-b"
use_node_b() {
  NODE_NAME="$NODE_B_NAME"
  BRIDGE="ckpt1"
  NODE_IP="10.244.1.1"
  POD_CIDR="10.244.1.0/24"
  KUBELET_HEALTHZ_PORT=10268
  STATE="$STATE/node-b"
  CONTAINERD_SOCK="$STATE/containerd/containerd.sock"
  RUNC_ROOT="$STATE/containerd/runc"
  CNI_NETWORK="ckptdrain-e2e-b"
  CGROUP_ROOT="/ckptdrain-e2e-b"
  POD_LOGS_DIR="$STATE/pod-logs"
}
[ "${E2E_NODE:-a}" != b ] || use_node_b

E2E_CLUSTER_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
E2E_REPO_ROOT="$(cd "$E2E_CLUSTER_DIR/../.." && pwd)"

log() { printf '%s [cluster] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# render TEMPLATE: prints the template with @NAME@ replaced by $NAME.
render() {
  local text name
  text="$(cat "$1")"
  for name in STATE NODE_NAME BRIDGE NODE_IP POD_CIDR SERVICE_CIDR CLUSTER_DOMAIN \
      KUBELET_PORT KUBELET_HEALTHZ_PORT KUBE_PROXY_HEALTHZ_PORT KUBE_PROXY_METRICS_PORT \
      PAUSE_IMAGE CONTAINERD_SOCK RUNC_ROOT CNI_BIN_DIR CNI_NETWORK \
      COREDNS_HEALTH_PORT COREDNS_READY_PORT API_IP CLUSTER_CIDR CGROUP_ROOT POD_LOGS_DIR; do
    text="${text//@$name@/${!name}}"
  done
  printf '%s\n' "$text"
}

pidfile() { echo "$STATE/run/$1.pid"; }

# alive PID [NAME]: the process exists, is not a zombie (our daemons outlive
# the shell that started them, and PID 1 here may be slow to reap them) and,
# given NAME, its command line mentions NAME (a pid file that outlived a
# reboot must not make us skip a start, or kill a stranger).
alive() {
  [ -n "$1" ] && kill -0 "$1" 2>/dev/null || return 1
  ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null || return 1
  [ -z "${2:-}" ] || tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "$2"
}

# running NAME: true when the daemon we started under NAME is still alive.
running() {
  local pid
  pid="$(cat "$(pidfile "$1")" 2>/dev/null)" || return 1
  alive "$pid" "$1"
}

# start_daemon NAME CMD...: runs CMD in its own session (so it outlives the
# shell that started it), logs to $STATE/logs/NAME.log, records its pid.
start_daemon() {
  local name="$1"; shift
  if running "$name"; then log "$name already running (pid $(cat "$(pidfile "$name")"))"; return 0; fi
  mkdir -p "$STATE/run" "$STATE/logs"
  log "starting $name"
  setsid "$@" >>"$STATE/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$(pidfile "$name")"
}

# stop_daemon NAME [GRACE_SECONDS]: SIGTERM, then SIGKILL after the grace.
stop_daemon() {
  local name="$1" grace="${2:-15}" pid i
  pid="$(cat "$(pidfile "$name")" 2>/dev/null)" || return 0
  if alive "$pid" "$name"; then
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < grace * 10; i++)); do alive "$pid" || break; sleep 0.1; done
    if alive "$pid"; then
      log "$name did not stop in ${grace}s; killing it"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.2
    fi
  fi
  rm -f "$(pidfile "$name")"
}

# wait_for SECONDS WHAT CMD...: polls CMD until it succeeds; on timeout
# prints the tail of the daemon log named WHAT (if any) and fails.
wait_for() {
  local timeout="$1" what="$2" deadline
  shift 2
  deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      log "timed out after ${timeout}s waiting for $what"
      [ -f "$STATE/logs/$what.log" ] && tail -n 30 "$STATE/logs/$what.log" >&2
      return 1
    fi
    sleep 0.5
  done
}

# start_kubelet [PREFIX...]: the node's kubelet (config rendered by node.sh
# start) and its health. One place for its flags, so a restart is the same
# kubelet; PREFIX (node.sh start-kubelet's `env -i` with the stopped
# kubelet's environment) runs it.
start_kubelet() {
  start_daemon kubelet "$@" "$K8S_BIN/kubelet" \
    --config="$STATE/kubelet/config.yaml" \
    --kubeconfig="$STATE/kubelet.kubeconfig" \
    --root-dir="$STATE/kubelet" \
    --hostname-override="$NODE_NAME" --node-ip="$NODE_IP"
  wait_for 120 kubelet curl -sf "http://127.0.0.1:$KUBELET_HEALTHZ_PORT/healthz"
}

kctl() { "$K8S_BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }
actl() { ctr --address "$CONTAINERD_SOCK" -n k8s.io "$@"; }
