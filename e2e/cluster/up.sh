#!/usr/bin/env bash
# Starts the e2e cluster: etcd, kube-apiserver, controller-manager, scheduler,
# CoreDNS and kube-proxy, and two nodes on this host (node.sh: containerd with
# its own config and state, a CNI bridge network and a kubelet each; the
# second one tainted, for what needs two nodes). One command; idempotent (a running
# piece is kept). Ends by printing `export KUBECONFIG=...`. Stop with down.sh.
#
# Needs root. Builds what it lacks into the cache (build-k8s.sh,
# build-coredns.sh, the pause image) and installs Debian's containerd, runc,
# containernetworking-plugins, iptables, conntrack if missing (e2e/deps/host.sh).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
started=$SECONDS
trap 'log "up.sh failed; logs in $STATE/logs; e2e/cluster/down.sh cleans up"' ERR

[ "$(id -u)" = 0 ] || die "run as root (it creates a bridge, iptables rules and cgroups)"

# Binaries, built once into the cache (cold: ~17 min on 2 cores; cached: a
# second). See build-k8s.sh for the version pin.
K8S_BIN="$(nice -n 10 "$E2E_CLUSTER_DIR/build-k8s.sh" \
  kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)"
COREDNS_BIN="$(nice -n 10 "$E2E_CLUSTER_DIR/build-coredns.sh")"

"$E2E_REPO_ROOT/e2e/deps/host.sh" cluster

ETCD_BIN="$("$E2E_REPO_ROOT/e2e/deps/etcd.sh")"

mkdir -p "$STATE"/{run,logs,etcd,kubelet,cni/net.d,cni/ipam,containerd,coredns}
"$E2E_CLUSTER_DIR/pki.sh"
PKI="$STATE/pki"

# --- network: our bridges, our sysctls, our iptables chain ------------------
"$E2E_CLUSTER_DIR/node.sh" bridge
E2E_NODE=b "$E2E_CLUSTER_DIR/node.sh" bridge

# Remember what the host had, so down.sh can put it back.
sysctl_file="$STATE/run/sysctl.saved"
[ -f "$sysctl_file" ] || {
  modprobe br_netfilter 2>/dev/null || true
  for key in net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables; do
    echo "$key=$(sysctl -n "$key")"
  done >"$sysctl_file"
}
# Forwarding between pods and Service DNAT; bridged replies must see
# iptables so that DNAT'd connections are un-NAT'd.
sysctl -q -w net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1

# Pods may talk to each other (on either node's bridge) and to the nodes' own
# addresses (INPUT), and nothing else: traffic from our bridges to any other
# interface is dropped.
iptables -N "$IPTABLES_CHAIN" 2>/dev/null || iptables -F "$IPTABLES_CHAIN"
iptables -A "$IPTABLES_CHAIN" -i "$BRIDGES" -o "$BRIDGES" -j ACCEPT
iptables -A "$IPTABLES_CHAIN" -i "$BRIDGES" -j DROP
# Our jump goes first in FORWARD, above the ACCEPTs kube-proxy (and Docker)
# insert, and is put back on top once kube-proxy has added its own.
pin_forward_chain() {
  while iptables -D FORWARD -j "$IPTABLES_CHAIN" 2>/dev/null; do :; done
  iptables -I FORWARD 1 -j "$IPTABLES_CHAIN"
}
pin_forward_chain

printf 'nameserver 127.0.0.1\n' >"$STATE/resolv.conf"

# --- etcd -------------------------------------------------------------------
start_daemon etcd nice -n 5 "$ETCD_BIN" \
  --name ckptdrain-e2e --data-dir "$STATE/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster "ckptdrain-e2e=http://127.0.0.1:$ETCD_PEER_PORT" --initial-cluster-state new
wait_for 60 etcd curl -sf "http://127.0.0.1:$ETCD_PORT/health"

# --- control plane ----------------------------------------------------------
start_daemon kube-apiserver "$K8S_BIN/kube-apiserver" \
  --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --bind-address="$NODE_IP" --advertise-address="$NODE_IP" --secure-port="$APISERVER_PORT" \
  --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
  --client-ca-file="$PKI/ca.crt" \
  --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority="$PKI/ca.crt" --kubelet-preferred-address-types=InternalIP \
  --service-account-issuer="https://kubernetes.default.svc.$CLUSTER_DOMAIN" \
  --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
  --service-cluster-ip-range="$SERVICE_CIDR" \
  --authorization-mode=Node,RBAC \
  --enable-admission-plugins=NodeRestriction \
  --enable-aggregator-routing=true \
  --allow-privileged=true \
  --profiling=false
apiserver_ready() { curl -sf --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "https://$NODE_IP:$APISERVER_PORT/readyz"; }
wait_for 120 kube-apiserver apiserver_ready

start_daemon kube-controller-manager "$K8S_BIN/kube-controller-manager" \
  --kubeconfig="$STATE/controller-manager.kubeconfig" \
  --authentication-kubeconfig="$STATE/controller-manager.kubeconfig" \
  --authorization-kubeconfig="$STATE/controller-manager.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port="$CONTROLLER_MANAGER_PORT" \
  --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
  --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
  --use-service-account-credentials=true \
  --service-cluster-ip-range="$SERVICE_CIDR" \
  --leader-elect=false --profiling=false
start_daemon kube-scheduler "$K8S_BIN/kube-scheduler" \
  --kubeconfig="$STATE/scheduler.kubeconfig" \
  --authentication-kubeconfig="$STATE/scheduler.kubeconfig" \
  --authorization-kubeconfig="$STATE/scheduler.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port="$SCHEDULER_PORT" \
  --leader-elect=false --profiling=false

# --- cluster DNS: CoreDNS on the node, cluster names only -------------------
kctl apply -f "$E2E_CLUSTER_DIR/coredns-rbac.yaml" >/dev/null
render "$E2E_CLUSTER_DIR/coredns.conf" >"$STATE/coredns/Corefile"
start_daemon coredns "$COREDNS_BIN" -conf "$STATE/coredns/Corefile"

# --- nodes: containerd, CNI and kubelet of each (node.sh) --------------------
"$E2E_CLUSTER_DIR/node.sh" start
E2E_NODE=b "$E2E_CLUSTER_DIR/node.sh" start

render "$E2E_CLUSTER_DIR/kube-proxy.yaml" >"$STATE/kube-proxy.yaml"
start_daemon kube-proxy "$K8S_BIN/kube-proxy" --config="$STATE/kube-proxy.yaml"
wait_for 60 kube-proxy curl -sf "http://127.0.0.1:$KUBE_PROXY_HEALTHZ_PORT/livez"
wait_for 30 kube-proxy iptables -C FORWARD -j KUBE-FORWARD -m comment --comment "kubernetes forwarding rules"
pin_forward_chain
wait_for 60 coredns curl -sf "http://127.0.0.1:$COREDNS_READY_PORT/ready"

wait_for 120 kubelet kctl get node "$NODE_NAME"
kctl wait --for=condition=Ready "node/$NODE_NAME" --timeout=120s >/dev/null \
  || { tail -n 30 "$STATE/logs/kubelet.log" >&2; die "node $NODE_NAME not Ready"; }
wait_for 120 kubelet kctl get node "$NODE_B_NAME"
kctl wait --for=condition=Ready "node/$NODE_B_NAME" --timeout=120s >/dev/null \
  || { tail -n 30 "$STATE/node-b/logs/kubelet.log" >&2; die "node $NODE_B_NAME not Ready"; }
# One zone each, so the peer tier pairs across zones as it would in a cloud.
kctl label --overwrite node "$NODE_NAME" topology.kubernetes.io/zone=e2e-a >/dev/null
kctl label --overwrite node "$NODE_B_NAME" topology.kubernetes.io/zone=e2e-b >/dev/null
# The default ServiceAccount must exist before pods can be created.
wait_for 60 kube-controller-manager kctl -n default get serviceaccount default

log "cluster up in $((SECONDS - started))s (nodes $NODE_NAME and $NODE_B_NAME Ready; state in $STATE)"
echo "export KUBECONFIG=$KUBECONFIG_ADMIN"
