#!/usr/bin/env bash
# Gives a server running on the node (bound to the bridge address, e.g. an
# S3 server the tests start) a Service name inside the cluster:
#   host-service.sh NAMESPACE NAME PORT
# makes NAME.NAMESPACE.svc.cluster.local:PORT reach $NODE_IP:PORT, through a
# selector-less Service and an EndpointSlice that points at the node. Pods can
# also use $NODE_IP:PORT directly; the name is what a user would configure.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[ $# -eq 3 ] || die "usage: host-service.sh NAMESPACE NAME PORT"
ns="$1" name="$2" port="$3"
kctl create namespace "$ns" --dry-run=client -o yaml | kctl apply -f - >/dev/null
kctl -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata: {name: $name}
spec:
  ports: [{name: main, port: $port, targetPort: $port, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: $name-node
  labels:
    kubernetes.io/service-name: $name
    endpointslice.kubernetes.io/managed-by: ckptdrain-e2e
addressType: IPv4
ports: [{name: main, port: $port, protocol: TCP}]
endpoints:
- addresses: ["$NODE_IP"]
  conditions: {ready: true}
EOF
log "service $name.$ns.svc.$CLUSTER_DOMAIN:$port -> $NODE_IP:$port"
