#!/usr/bin/env bash
# Stops the e2e cluster started by up.sh and removes what it put on the host:
# processes, containers, mounts, network namespaces, the bridge, the iptables
# chains and rules, the kubepods cgroups, and the sysctls it changed. Keeps
# the certificates and the images loaded into containerd (a warm start), and
# wipes the cluster's data (etcd, kubelet, IPAM) so the next up.sh is fresh.
# Best effort and idempotent: safe to run on a half-started or dead cluster.
# Exits non-zero if anything of ours is still running or mounted at the end.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
started=$SECONDS
[ "$(id -u)" = 0 ] || die "run as root"

# --- node b first (the same steps, on its own state: E2E_NODE=b) -------------
rc_b=0
if [ "${E2E_NODE:-a}" != b ] && [ -d "$STATE/node-b" ]; then
  E2E_NODE=b "$E2E_CLUSTER_DIR/down.sh" || rc_b=1
fi

# --- the node: no kubelet to recreate anything, then every container --------
stop_daemon kube-proxy 10
stop_daemon kubelet 20

if running containerd; then
  # Killing the tasks lets the shims report and exit once deleted; containers
  # are removed too (with their snapshots), images stay for the next start.
  # (The CRI plugin deletes a task itself when it sees it exit.)
  for t in $(actl tasks ls -q 2>/dev/null); do actl tasks kill -a -s SIGKILL "$t" >/dev/null 2>&1; done
  for _ in $(seq 50); do [ -z "$(actl tasks ls -q 2>/dev/null)" ] && break; sleep 0.2; done
  for t in $(actl tasks ls -q 2>/dev/null); do actl tasks delete -f "$t" >/dev/null 2>&1; done
  for c in $(actl containers ls -q 2>/dev/null); do actl containers delete "$c" >/dev/null 2>&1; done
fi
stop_daemon containerd 15

# Whatever survived (containerd died earlier, a shim hung): runc state in our
# own runc root, and shims that were started for our containerd socket.
if [ -d "$RUNC_ROOT/k8s.io" ]; then
  for id in $(runc --root "$RUNC_ROOT/k8s.io" list -q 2>/dev/null); do
    runc --root "$RUNC_ROOT/k8s.io" kill "$id" KILL >/dev/null 2>&1
    runc --root "$RUNC_ROOT/k8s.io" delete -f "$id" >/dev/null 2>&1
  done
fi
for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $CONTAINERD_SOCK( |$)"); do
  log "killing leftover shim $pid"; kill -KILL "$pid" 2>/dev/null
done

# --- network namespaces and veths the CNI bridge plugin made ---------------
# libcni caches each ADD result; the container side interface's "sandbox"
# is the netns path containerd bind-mounted (in /var/run/netns).
for f in /var/lib/cni/results/"$CNI_NETWORK"-*; do
  [ -f "$f" ] || continue
  netns="$(python3 -c 'import json,sys
r = json.load(open(sys.argv[1])).get("result") or {}
print("\n".join(sorted({i.get("sandbox", "") for i in r.get("interfaces", []) if i.get("sandbox")})))' "$f" 2>/dev/null)"
  for ns in $netns; do
    case "$ns" in /var/run/netns/*|/run/netns/*) ;; *) continue ;; esac
    umount "$ns" 2>/dev/null || umount -l "$ns" 2>/dev/null
    rm -f "$ns"
  done
  # containerd also ran the loopback plugin for the same container.
  id="${f#/var/lib/cni/results/$CNI_NETWORK-}"
  rm -f "$f" "/var/lib/cni/results/cni-loopback-${id%-*}-lo"
done
for veth in $(ip -o link show master "$BRIDGE" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
  ip link del "$veth" 2>/dev/null
done

# --- control plane (before the bridge: the apiserver listens on it) ----------
stop_daemon coredns 10
stop_daemon kube-scheduler 10
stop_daemon kube-controller-manager 10
stop_daemon kube-apiserver 20
stop_daemon etcd 15
ip link del "$BRIDGE" 2>/dev/null && log "removed bridge $BRIDGE"

# --- mounts under the state dir (kubelet volumes, its rshared root, rootfs,
# sandbox shm), deepest first -------------------------------------------------
for _ in 1 2 3; do
  mounts="$(awk -v s="$STATE/" 'index($5, s) == 1 {print $5}' /proc/self/mountinfo | awk '{print length, $0}' | sort -rn | cut -d' ' -f2-)"
  [ -n "$mounts" ] || break
  for m in $mounts; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done
done

# --- iptables: our chain, kube-proxy's and the kubelet's KUBE-*, portmap's CNI-*
ipt_cleanup() {
  local ipt="$1" t rule chains c
  command -v "$ipt" >/dev/null || return 0
  for t in filter nat mangle raw; do
    # Jumps from the built-in chains first, then flush and delete the chains.
    "$ipt" -t "$t" -S 2>/dev/null \
      | grep -E "^-A (INPUT|OUTPUT|FORWARD|PREROUTING|POSTROUTING) .*-j ($IPTABLES_CHAIN|KUBE-[A-Z0-9-]+|CNI-[A-Za-z0-9-]+)( |$)" \
      | while read -r rule; do eval "\"$ipt\" -t $t ${rule/#-A/-D}" 2>/dev/null; done
    chains="$("$ipt" -t "$t" -S 2>/dev/null | awk -v ours="$IPTABLES_CHAIN" '$1 == "-N" && ($2 == ours || $2 ~ /^(KUBE|CNI)-/) {print $2}')"
    for c in $chains; do "$ipt" -t "$t" -F "$c" 2>/dev/null; done
    for c in $chains; do "$ipt" -t "$t" -X "$c" 2>/dev/null; done
  done
}
ipt_cleanup iptables
ipt_cleanup ip6tables
conntrack -D -s "$POD_CIDR" >/dev/null 2>&1 || true
conntrack -D -d "$POD_CIDR" >/dev/null 2>&1 || true

# --- cgroups the kubelet created (cgroupfs driver, v1 and the v2 beside it) ---
root="${CGROUP_ROOT%/}"
for top in /sys/fs/cgroup/*"$root"/kubepods /sys/fs/cgroup"$root"/kubepods; do
  [ -d "$top" ] || continue
  find "$top" -depth -type d -exec rmdir {} \; 2>/dev/null
  [ -d "$top" ] && log "WARNING: could not remove cgroup $top (processes left in it?)"
done
if [ -n "$root" ]; then  # node b's own cgroup root
  for dir in /sys/fs/cgroup/*"$root"; do [ -d "$dir" ] && rmdir "$dir" 2>/dev/null; done
fi

# --- sysctls back to what the host had --------------------------------------
if [ -f "$STATE/run/sysctl.saved" ]; then
  while IFS= read -r kv; do sysctl -q -w "$kv" >/dev/null 2>&1; done <"$STATE/run/sysctl.saved"
  rm -f "$STATE/run/sysctl.saved"
fi

# --- data: a fresh cluster next time; keep pki, images (containerd root), logs
rm -rf "$STATE/etcd" "$STATE/kubelet" "$STATE/cni/ipam" "$STATE/containerd/state" "$STATE/containerd/runc"
if [ -d "$STATE/logs" ]; then rm -rf "$STATE/logs.prev"; mv "$STATE/logs" "$STATE/logs.prev"; fi

# --- verify -------------------------------------------------------------------
left=0
if pgrep -af -- "$STATE" >&2; then log "still running (above)"; left=1; fi
if pgrep -af "containerd-shim-runc-v2 .*$CONTAINERD_SOCK" >&2; then left=1; fi
if awk -v s="$STATE/" 'index($5, s) == 1 {print "mounted: " $5; found=1} END {exit !found}' /proc/self/mountinfo >&2; then left=1; fi
if ip link show "$BRIDGE" >/dev/null 2>&1; then log "bridge $BRIDGE still there"; left=1; fi
if iptables -S 2>/dev/null | grep -q -- "$IPTABLES_CHAIN"; then log "iptables chain $IPTABLES_CHAIN still there"; left=1; fi
if ((left)); then die "down: something was left behind (see above)"; fi
((rc_b == 0)) || die "down: node b left something behind (see above)"
log "${NODE_NAME} down in $((SECONDS - started))s; nothing left running (logs in $STATE/logs.prev)"
