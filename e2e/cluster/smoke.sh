#!/usr/bin/env bash
# Smoke check of the e2e cluster, start to finish:
#   up.sh; a pod on the locally built pause image goes Running; a ClusterIP
#   Service reaches a server pod from another pod and from the host; a pod
#   reaches the apiserver through the `kubernetes` Service; `kubectl logs`
#   works (apiserver -> kubelet); if Docker has ckptdrain:dev, a pod runs
#   `ckptdrain --version`; then down.sh, and nothing of ours is left running.
# Usage: smoke.sh [--keep]   (--keep: leave the cluster up afterwards)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
keep=false
[ "${1:-}" = --keep ] && keep=true
t0=$SECONDS
ns=smoke

eval "$("$E2E_CLUSTER_DIR/up.sh")"
log "smoke: cluster up in $((SECONDS - t0))s"

fail() {
  log "SMOKE FAILED: $*"
  kctl -n "$ns" get pods -o wide >&2 || true
  kctl -n "$ns" get events --sort-by=.lastTimestamp 2>/dev/null | tail -n 20 >&2 || true
  $keep || "$E2E_CLUSTER_DIR/down.sh" >&2 || true
  exit 1
}

netcheck_archive="$("$E2E_REPO_ROOT/e2e/images/pause/build.sh" netcheck)"
"$E2E_CLUSTER_DIR/load-images.sh" --oci "$netcheck_archive"
images=(localhost/ckptdrain/netcheck:1.0)
have_ckptdrain=false
if command -v docker >/dev/null && docker image inspect ckptdrain:dev >/dev/null 2>&1; then
  "$E2E_CLUSTER_DIR/load-images.sh" ckptdrain:dev
  have_ckptdrain=true
fi

kctl create namespace "$ns" --dry-run=client -o yaml | kctl apply -f - >/dev/null
wait_for 60 kube-controller-manager kctl -n "$ns" get serviceaccount default

kctl -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: pause}
spec:
  containers:
  - {name: pause, image: $PAUSE_IMAGE}
---
apiVersion: v1
kind: Pod
metadata: {name: server, labels: {app: netcheck}}
spec:
  containers:
  - name: server
    image: ${images[0]}
    args: [serve, ":8080"]
    ports: [{containerPort: 8080}]
    readinessProbe:
      tcpSocket: {port: 8080}
      periodSeconds: 1
---
apiVersion: v1
kind: Service
metadata: {name: netcheck}
spec:
  selector: {app: netcheck}
  ports: [{port: 80, targetPort: 8080}]
EOF
kctl -n "$ns" wait --for=condition=Ready pod/pause pod/server --timeout=120s >/dev/null || fail "pods not Ready"
log "smoke: pause and server pods Running ($((SECONDS - t0))s)"

svc_ip="$(kctl -n "$ns" get service netcheck -o jsonpath='{.spec.clusterIP}')"
# No cluster DNS: pods find Services through the environment the kubelet
# injects, $(NAME_SERVICE_HOST) expanded in args.
kctl -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  restartPolicy: Never
  containers:
  - name: service
    image: ${images[0]}
    args: [get, "\$(NETCHECK_SERVICE_HOST):\$(NETCHECK_SERVICE_PORT)", 60s]
  - name: apiserver
    image: ${images[0]}
    args: [dial, "\$(KUBERNETES_SERVICE_HOST):\$(KUBERNETES_SERVICE_PORT)", 60s]
EOF
if $have_ckptdrain; then
  kctl -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: version}
spec:
  restartPolicy: Never
  containers:
  - name: ckptdrain
    image: ckptdrain:dev
    imagePullPolicy: Never
    command: [ckptdrain, --version]
EOF
fi

succeeded() { [ "$(kctl -n "$ns" get pod "$1" -o jsonpath='{.status.phase}')" = Succeeded ]; }
wait_for 120 kubelet succeeded client || fail "client pod did not succeed"
answer="$(kctl -n "$ns" logs client -c service)"
echo "$answer" | grep -q "hello from server" || fail "pod -> Service $svc_ip: unexpected answer '$answer'"
log "smoke: pod -> Service $svc_ip:80 -> server pod: '$answer'"
log "smoke: pod -> kubernetes Service: $(kctl -n "$ns" logs client -c apiserver)"

# From the host, as the apiserver would reach a webhook's Service.
host_answer="$(timeout 10 bash -c "exec 3<>/dev/tcp/$svc_ip/80 && cat <&3" 2>/dev/null)" \
  || fail "host -> Service $svc_ip:80: no answer"
echo "$host_answer" | grep -q "hello from server" || fail "host -> Service: unexpected '$host_answer'"
log "smoke: host -> Service $svc_ip:80: '$host_answer'"

if $have_ckptdrain; then
  wait_for 120 kubelet succeeded version || fail "ckptdrain --version pod did not succeed"
  log "smoke: ckptdrain:dev in a pod: $(kctl -n "$ns" logs version)"
else
  log "smoke: no ckptdrain:dev in Docker yet: skipped the ckptdrain --version pod"
fi
# cgroup v1: the kubelet runs, and says so only through a Warning event.
cgv1="$(kctl get events -A --field-selector reason=CgroupV1 -o jsonpath='{.items[0].message}' 2>/dev/null)"
log "smoke: kubelet on cgroup v1 runs; its warning: '${cgv1:-none}'"
log "smoke: checks passed in $((SECONDS - t0))s"

if $keep; then
  log "smoke: cluster left up (--keep); namespace $ns"
  echo "export KUBECONFIG=$KUBECONFIG_ADMIN"
  exit 0
fi
t1=$SECONDS
"$E2E_CLUSTER_DIR/down.sh"
if pgrep -af -- "$STATE" >&2; then log "SMOKE FAILED: processes left after down.sh (above)"; exit 1; fi
log "smoke: down in $((SECONDS - t1))s; nothing left running; total $((SECONDS - t0))s"
