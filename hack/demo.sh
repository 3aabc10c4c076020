#!/usr/bin/env bash
# The dsproxy demo on a real control plane: etcd + kube-apiserver +
# kube-controller-manager v1.36 (hack/controlplane), a "node" network namespace
# running dsproxy, two "pod" namespaces with HTTP servers, dual-stack and
# single-stack Services, and curl over IPv4 and IPv6 ClusterIPs and NodePorts.
#
# Usage: hack/demo.sh        set up, show, and leave it running to look around
#        hack/demo.sh down   tear everything down
# Everything lives in network namespaces this script creates; the host's network
# is never modified.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cp="$root/hack/controlplane"
NODE=dsproxy-demo-node
NODE_NAME=demo-node
PODS=(pod-a pod-b)
RUN=${DSPROXY_CP_RUN:-/tmp/dsproxy-cp}
LOG=/tmp/dsproxy-demo.log
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
k() { "$cp/kubectl.sh" "$@"; }
innode() { ip netns exec "$NODE" "$@"; }

down() {
	if [ -f /tmp/dsproxy-demo.pid ]; then kill "$(cat /tmp/dsproxy-demo.pid)" 2>/dev/null || true; rm -f /tmp/dsproxy-demo.pid; fi
	for p in "${PODS[@]}"; do
		pkill -f "/tmp/dsproxy-demo-$p.sh" 2>/dev/null || true
		ip netns del "dsproxy-demo-$p" 2>/dev/null || true
	done
	"$cp/down.sh" || true
	ip netns del "$NODE" 2>/dev/null || true
}
if [ "${1:-}" = down ]; then down; exit 0; fi
[ "$(id -u)" = 0 ] || { echo "demo: run as root (network namespaces)" >&2; exit 1; }

say "Installing dependencies and building (cached after the first run)"
"$root/hack/install-deps.sh"
make -C "$root" build >/dev/null
"$cp/build.sh"

say "Starting the control plane (etcd, kube-apiserver, kube-controller-manager) in netns dsproxy-cp"
"$cp/up.sh" --link "$NODE"
node4=172.31.255.2
node6=fd00:ffff::2
innode sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1
# A node has a default route; without one, connects to ClusterIPs fail before the
# proxy's rules see them. Unknown destinations go to the control-plane namespace.
innode ip route replace default via 172.31.255.1
innode ip -6 route replace default via fd00:ffff::1

say "Creating pods as network namespaces with HTTP servers"
i=0
for p in "${PODS[@]}"; do
	i=$((i + 1))
	ns=dsproxy-demo-$p ip4=10.64.0.$((10 + i)) ip6=fd00:64::$((10 + i))
	ip netns del "$ns" 2>/dev/null || true
	ip netns add "$ns"
	ip link add "vd$i" netns "$NODE" type veth peer name eth0 netns "$ns"
	ip -n "$ns" link set lo up
	ip -n "$ns" link set eth0 up
	ip -n "$ns" addr add "$ip4/32" dev eth0
	ip -n "$ns" addr add "$ip6/128" dev eth0 nodad
	ip -n "$NODE" link set "vd$i" up
	ip -n "$NODE" addr add "$node4/32" dev "vd$i"
	ip -n "$NODE" addr add "$node6/128" dev "vd$i" nodad
	ip -n "$NODE" route add "$ip4/32" dev "vd$i"
	ip -n "$NODE" route add "$ip6/128" dev "vd$i"
	ip -n "$ns" route add "$node4/32" dev eth0
	ip -n "$ns" route add default via "$node4" dev eth0
	ip -n "$ns" -6 route add "$node6/128" dev eth0
	ip -n "$ns" -6 route add default via "$node6" dev eth0
	printf '#!/bin/sh\nprintf "HTTP/1.0 200 OK\\r\\nContent-Type: text/plain\\r\\n\\r\\nhello from %s\\n"\n' "$p" >"/tmp/dsproxy-demo-$p.sh"
	chmod +x "/tmp/dsproxy-demo-$p.sh"
	ip netns exec "$ns" socat "TCP6-LISTEN:8080,fork,reuseaddr,ipv6only=0" "EXEC:/tmp/dsproxy-demo-$p.sh" >/dev/null 2>&1 &
done

say "Registering the node and the pods with the API server"
k apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata: {name: $NODE_NAME, labels: {kubernetes.io/hostname: $NODE_NAME}}
YAML
k patch node "$NODE_NAME" --subresource=status --type=merge -p \
	"{\"status\":{\"addresses\":[{\"type\":\"InternalIP\",\"address\":\"$node4\"},{\"type\":\"InternalIP\",\"address\":\"$node6\"}]}}" >/dev/null
i=0
for p in "${PODS[@]}"; do
	i=$((i + 1))
	k apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $p, namespace: default, labels: {app: demo}}
spec:
  nodeName: $NODE_NAME
  containers: [{name: web, image: demo, ports: [{containerPort: 8080}]}]
YAML
	k patch pod "$p" --subresource=status --type=merge -p "{\"status\":{\"phase\":\"Running\",
	  \"podIP\":\"10.64.0.$((10 + i))\",\"podIPs\":[{\"ip\":\"10.64.0.$((10 + i))\"},{\"ip\":\"fd00:64::$((10 + i))\"}],
	  \"conditions\":[{\"type\":\"Ready\",\"status\":\"True\"}]}}" >/dev/null
done

say "Creating Services: dual-stack NodePort, IPv4-only, IPv6-only"
k apply -f - >/dev/null <<'YAML'
apiVersion: v1
kind: Service
metadata: {name: web-dual, namespace: default}
spec:
  type: NodePort
  ipFamilyPolicy: RequireDualStack
  selector: {app: demo}
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}]
---
apiVersion: v1
kind: Service
metadata: {name: web-v4, namespace: default}
spec:
  ipFamilyPolicy: SingleStack
  ipFamilies: [IPv4]
  selector: {app: demo}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: web-v6, namespace: default}
spec:
  ipFamilyPolicy: SingleStack
  ipFamilies: [IPv6]
  selector: {app: demo}
  ports: [{name: http, port: 80, targetPort: 8080}]
YAML

say "Starting dsproxy in the node namespace (log: $LOG)"
innode "$root/bin/dsproxy" --kubeconfig "$RUN/kubeconfig.link" --hostname-override "$NODE_NAME" \
	--cluster-cidr 10.64.0.0/16,fd00:64::/56 --metrics-bind-address 127.0.0.1:10249 -v=2 >"$LOG" 2>&1 &
echo $! >/tmp/dsproxy-demo.pid

ip_of() { k get svc "$1" -o "jsonpath={.spec.clusterIPs[$2]}"; }
fetch() { # url
	local out
	for _ in $(seq 1 50); do
		if out=$(innode curl -sS -g --max-time 2 "$1" 2>&1); then printf '  %-34s -> %s\n' "$1" "$out"; return 0; fi
		sleep 0.2
	done
	printf '  %-34s -> FAILED: %s\n' "$1" "$out"
	return 1
}
say "curl from the node namespace"
ok=0
fetch "http://$(ip_of web-dual 0)/" || ok=1
fetch "http://[$(ip_of web-dual 1)]/" || ok=1
fetch "http://$node4:30080/" || ok=1
fetch "http://[$node6]:30080/" || ok=1
fetch "http://$(ip_of web-v4 0)/" || ok=1
fetch "http://[$(ip_of web-v6 0)]/" || ok=1

cat <<EOF
Look around:
  hack/controlplane/kubectl.sh get svc,endpointslices -o wide
  ip netns exec $NODE curl -s 127.0.0.1:10249/metrics | grep kubeproxy_
  tail -f $LOG
(nft 1.0.6's CLI aborts listing dsproxy's concatenated maps; dsproxy itself never runs nft.)
Tear down:
  hack/demo.sh down
EOF
exit $ok
