#!/usr/bin/env bash
# Creates the e2e cluster's CA, serving and client certificates, the service
# account key pair and the kubeconfigs, once, under $STATE/pki. Idempotent:
# existing files are kept (delete $STATE/pki to start over).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PKI="$STATE/pki"
mkdir -p "$PKI"
chmod 700 "$PKI"
cd "$PKI"

newkey() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; chmod 600 "$1"; }

if [ "${E2E_NODE:-a}" = b ]; then
  # Node b's kubelet certificates are signed by the cluster's one CA.
  main="$(dirname "$STATE")/pki"
  [ -s "$main/ca.key" ] || { echo "node b needs the cluster's CA first" >&2; exit 1; }
  cp "$main/ca.crt" "$main/ca.key" .
  chmod 600 ca.key
fi
if [ ! -s ca.crt ]; then
  newkey ca.key
  openssl req -x509 -new -key ca.key -out ca.crt -days 3650 -subj "/CN=ckptdrain-e2e-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi

# cert NAME SUBJECT USAGE [SANS]: a leaf certificate signed by the CA.
cert() {
  local name="$1" subject="$2" usage="$3" sans="${4:-}"
  [ -s "$name.crt" ] && return 0
  newkey "$name.key"
  openssl req -new -key "$name.key" -out "$name.csr" -subj "$subject" 2>/dev/null
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$usage"
    [ -z "$sans" ] || echo "subjectAltName=$sans"
  } >"$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
    -out "$name.crt" -days 3650 -extfile "$name.ext" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
}

if [ "${E2E_NODE:-a}" != b ]; then
  cert apiserver "/CN=kube-apiserver" serverAuth \
    "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.$CLUSTER_DOMAIN,DNS:localhost,IP:$API_IP,IP:$API_SERVICE_IP,IP:127.0.0.1"
  cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
  cert admin "/O=system:masters/CN=ckptdrain-e2e-admin" clientAuth
  cert controller-manager "/CN=system:kube-controller-manager" clientAuth
  cert scheduler "/CN=system:kube-scheduler" clientAuth
  cert kube-proxy "/CN=system:kube-proxy" clientAuth
  cert coredns "/CN=ckptdrain-e2e:coredns" clientAuth
fi
cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" clientAuth
cert kubelet-server "/CN=$NODE_NAME" serverAuth "DNS:$NODE_NAME,IP:$NODE_IP"

if [ "${E2E_NODE:-a}" = b ]; then
  rm -f ca.key ca.srl  # only the signing needed it
fi
if [ "${E2E_NODE:-a}" != b ] && [ ! -s sa.key ]; then
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key 2>/dev/null
  chmod 600 sa.key
  openssl pkey -in sa.key -pubout -out sa.pub 2>/dev/null
fi

# kubeconfig FILE CERT: a kubeconfig for the client certificate CERT.
kubeconfig() {
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: ckptdrain-e2e
  cluster:
    server: https://$API_IP:$APISERVER_PORT
    certificate-authority: $PKI/ca.crt
users:
- name: $2
  user:
    client-certificate: $PKI/$2.crt
    client-key: $PKI/$2.key
contexts:
- name: ckptdrain-e2e
  context:
    cluster: ckptdrain-e2e
    user: $2
current-context: ckptdrain-e2e
EOF
  chmod 600 "$1"
}
if [ "${E2E_NODE:-a}" != b ]; then
  kubeconfig "$KUBECONFIG_ADMIN" admin
  kubeconfig "$STATE/controller-manager.kubeconfig" controller-manager
  kubeconfig "$STATE/scheduler.kubeconfig" scheduler
  kubeconfig "$STATE/kube-proxy.kubeconfig" kube-proxy
  kubeconfig "$STATE/coredns.kubeconfig" coredns
fi
kubeconfig "$STATE/kubelet.kubeconfig" kubelet
