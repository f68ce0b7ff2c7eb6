#!/usr/bin/env bash
# Smoke check of the e2e cluster, start to finish:
#   up.sh; a pod on the locally built pause image goes Running; a ClusterIP
#   Service reaches a server pod from another pod (by IP and by DNS name) and
#   from the host; the apiserver calls a TLS webhook behind a Service; a pod
#   reaches the apiserver through the `kubernetes` Service, and a server on
#   the node through a host-service.sh Service; `kubectl logs`
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
python_image=""
if command -v docker >/dev/null; then
  # The project image if it is built, else its base: both have python3.
  for image in ckptdrain:dev ckptdrain-base:bookworm; do
    docker image inspect "$image" >/dev/null 2>&1 || continue
    "$E2E_CLUSTER_DIR/load-images.sh" "$image"
    [ "$image" = ckptdrain:dev ] && have_ckptdrain=true
    python_image="$image"
    break
  done
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

# A server on the node (where the tests run S3), named inside the cluster.
host_port=$((20000 + RANDOM % 10000))
setsid python3 -m http.server "$host_port" --bind "$NODE_IP" >/dev/null 2>&1 </dev/null &
host_server=$!
trap 'kill "$host_server" 2>/dev/null || true' EXIT
"$E2E_CLUSTER_DIR/host-service.sh" "$ns" on-node "$host_port"
# By name through the cluster DNS (short name: the search path), and by the
# environment the kubelet injects ($(NAME_SERVICE_HOST) expanded in args).
kctl -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  restartPolicy: Never
  containers:
  - name: dns
    image: ${images[0]}
    args: [get, "netcheck:80", 60s]
  - name: service
    image: ${images[0]}
    args: [get, "\$(NETCHECK_SERVICE_HOST):\$(NETCHECK_SERVICE_PORT)", 60s]
  - name: apiserver
    image: ${images[0]}
    args: [dial, "\$(KUBERNETES_SERVICE_HOST):\$(KUBERNETES_SERVICE_PORT)", 60s]
  - name: node
    image: ${images[0]}
    args: [dial, "on-node:$host_port", 60s]
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
answer="$(kctl -n "$ns" logs client -c dns)"
echo "$answer" | grep -q "hello from server" || fail "pod -> netcheck:80 by DNS name: unexpected answer '$answer'"
log "smoke: pod -> netcheck:80 (cluster DNS) -> server pod: '$answer'"
log "smoke: pod -> kubernetes Service: $(kctl -n "$ns" logs client -c apiserver)"
log "smoke: pod -> on-node Service -> server on the node: $(kctl -n "$ns" logs client -c node)"
kill "$host_server" 2>/dev/null || true

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
# An admission webhook behind a Service, over TLS, called by the apiserver:
# what the operator's webhooks need. Any image with python3 will do.
if [ -n "$python_image" ]; then
  tls="$STATE/smoke-webhook"
  mkdir -p "$tls"
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$tls/tls.key" 2>/dev/null
  openssl req -new -key "$tls/tls.key" -subj "/CN=webhook.$ns.svc" -out "$tls/tls.csr" 2>/dev/null
  printf 'subjectAltName=DNS:webhook.%s.svc\nextendedKeyUsage=serverAuth\n' "$ns" >"$tls/ext"
  openssl x509 -req -in "$tls/tls.csr" -CA "$STATE/pki/ca.crt" -CAkey "$STATE/pki/ca.key" -CAcreateserial \
    -days 1 -extfile "$tls/ext" -out "$tls/tls.crt" 2>/dev/null
  kctl -n "$ns" create secret tls webhook-tls --cert="$tls/tls.crt" --key="$tls/tls.key" >/dev/null
  rm -rf "$tls"
  kctl -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: webhook, labels: {app: webhook}}
spec:
  containers:
  - name: webhook
    image: $python_image
    imagePullPolicy: Never
    command: [python3, -c]
    args:
    - |
      import http.server, json, ssl
      class Handler(http.server.BaseHTTPRequestHandler):
          def do_POST(self):
              review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
              body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "response": {"uid": review["request"]["uid"], "allowed": True,
                               "warnings": ["smoke webhook called"]}}).encode()
              self.send_response(200)
              self.send_header("Content-Type", "application/json")
              self.send_header("Content-Length", str(len(body)))
              self.end_headers()
              self.wfile.write(body)
      server = http.server.HTTPServer(("", 8443), Handler)
      context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
      context.load_cert_chain("/tls/tls.crt", "/tls/tls.key")
      server.socket = context.wrap_socket(server.socket, server_side=True)
      server.serve_forever()
    ports: [{containerPort: 8443}]
    readinessProbe:
      tcpSocket: {port: 8443}
      periodSeconds: 1
    volumeMounts: [{name: tls, mountPath: /tls, readOnly: true}]
  volumes:
  - name: tls
    secret: {secretName: webhook-tls}
---
apiVersion: v1
kind: Service
metadata: {name: webhook}
spec:
  selector: {app: webhook}
  ports: [{port: 443, targetPort: 8443}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: ckptdrain-e2e-smoke}
webhooks:
- name: smoke.ckptdrain.e2e
  clientConfig:
    service: {namespace: $ns, name: webhook, path: /validate, port: 443}
    caBundle: $(base64 -w0 <"$STATE/pki/ca.crt")
  rules:
  - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}
  objectSelector:
    matchLabels: {smoke-webhook: "on"}
  sideEffects: None
  admissionReviewVersions: [v1]
  failurePolicy: Fail
  timeoutSeconds: 10
EOF
  kctl -n "$ns" wait --for=condition=Ready pod/webhook --timeout=120s >/dev/null || fail "webhook pod not Ready"
  warning="$(kctl -n "$ns" create configmap probe --from-literal=a=b --dry-run=client -o yaml \
    | kctl label --local -f - smoke-webhook=on -o yaml | kctl -n "$ns" create -f - 2>&1 >/dev/null)" \
    || fail "create through the webhook failed: $warning"
  echo "$warning" | grep -q "smoke webhook called" || fail "the webhook was not called: '$warning'"
  kctl delete validatingwebhookconfiguration ckptdrain-e2e-smoke >/dev/null
  log "smoke: apiserver -> webhook Service over TLS: '$warning'"
else
  log "smoke: no image with python3 in Docker (ckptdrain:dev or ckptdrain-base:bookworm): skipped the webhook check"
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
