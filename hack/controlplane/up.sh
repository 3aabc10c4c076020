#!/usr/bin/env bash
# Brings up a real Kubernetes control plane (etcd + kube-apiserver +
# kube-controller-manager, no kubelet, no scheduler) inside the network
# namespace "dsproxy-cp". The host network namespace is never modified.
#
# Usage: up.sh [--link NETNS]... [--fresh]
#   --link NETNS  join NETNS (created if missing) to the control plane's link
#                 network with a veth pair, so clients in NETNS (e.g. dsproxy
#                 in a test "node" namespace) can reach the API server at
#                 https://172.31.255.1:6443 or https://[fd00:ffff::1]:6443.
#                 May be repeated, and re-run against a running control plane.
#   --fresh       tear down a running control plane first (empty etcd).
# If a healthy control plane is already running it is reused (only links are added).
#
# Network layout (all inside namespaces this script creates):
#   dsproxy-cp: lo (127.0.0.1: etcd :2379, apiserver :6443, kcm :10257)
#               cpbr0 bridge 172.31.255.1/24 fd00:ffff::1/64, ports cplN
#   NETNS (n-th link): interface "cplink" 172.31.255.(1+n)/24 fd00:ffff::(1+n)/64
#
# Outputs (run dir ${DSPROXY_CP_RUN:-/tmp/dsproxy-cp}):
#   kubeconfig        admin, https://127.0.0.1:6443   (use inside the cp netns,
#                     e.g. hack/controlplane/kubectl.sh get svc)
#   kubeconfig.link   admin, https://172.31.255.1:6443 (use inside a linked netns:
#                     ip netns exec NETNS kubectl --kubeconfig .../kubeconfig.link)
#   kubeconfig.link6  admin, https://[fd00:ffff::1]:6443
#   pki/              CA, serving, client certs, service-account keys
#   logs/             etcd.log kube-apiserver.log kube-controller-manager.log
#   env               shell-sourceable summary (paths, addresses)
#
# Service CIDRs 10.96.0.0/16,fd00:96::/112; cluster (pod) CIDRs
# 10.64.0.0/16,fd00:64::/56, node podCIDRs allocated (/24, /64).
# Stop with down.sh; status/health with status.sh.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=hack/controlplane/lib.sh
. "$here/lib.sh"

links=()
fresh=0
while [ $# -gt 0 ]; do
	case $1 in
	--link) links+=("$2"); shift 2 ;;
	--link=*) links+=("${1#--link=}"); shift ;;
	--fresh) fresh=1; shift ;;
	-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "up.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done

[ "$(id -u)" = 0 ] || { echo "up.sh: must run as root (network namespaces)" >&2; exit 1; }

log() { echo "up.sh: $*" >&2; }

# --- dependencies -----------------------------------------------------------
ensure_deps() {
	local missing=() installed_etcd=0
	command -v etcd >/dev/null || { missing+=(etcd-server); installed_etcd=1; }
	command -v openssl >/dev/null || missing+=(openssl)
	command -v curl >/dev/null || missing+=(curl ca-certificates)
	command -v ip >/dev/null || missing+=(iproute2)
	command -v flock >/dev/null || missing+=(util-linux)
	if [ ${#missing[@]} -gt 0 ]; then
		log "installing ${missing[*]}"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	fi
	if [ "$installed_etcd" = 1 ]; then
		# Debian starts an etcd service on install; we run our own in the netns.
		systemctl disable --now etcd >/dev/null 2>&1 || service etcd stop >/dev/null 2>&1 || true
	fi
}
ensure_deps
"$here/build.sh" >&2

mkdir -p "$RUN"
with_lock

if [ "$fresh" = 1 ]; then
	DSPROXY_CP_LOCKED=1 "$here/down.sh" >&2
fi

# --- PKI ----------------------------------------------------------------------
pki=$RUN/pki
gen_pki() {
	[ -f "$pki/.done-v2" ] && return 0
	log "generating certificates in $pki"
	rm -rf "$pki"
	mkdir -p "$pki"
	local d=3650
	openssl req -x509 -newkey rsa:2048 -nodes -days $d -subj "/CN=dsproxy-cp-ca" \
		-keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
	# name CN O SAN...
	issue() {
		local name=$1 cn=$2 org=$3 san=$4 ext=$pki/$1.ext subj="/CN=$2"
		[ -n "$org" ] && subj="/O=$org/CN=$cn"
		{
			echo "basicConstraints=critical,CA:FALSE"
			echo "keyUsage=critical,digitalSignature,keyEncipherment"
			if [ -n "$san" ]; then
				echo "extendedKeyUsage=serverAuth,clientAuth"
				echo "subjectAltName=$san"
			else
				echo "extendedKeyUsage=clientAuth"
			fi
		} >"$ext"
		openssl req -new -newkey rsa:2048 -nodes -subj "$subj" \
			-keyout "$pki/$name.key" -out "$pki/$name.csr" 2>/dev/null
		openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
			-CAcreateserial -days $d -extfile "$ext" -out "$pki/$name.crt" 2>/dev/null
		rm -f "$pki/$name.csr" "$ext"
	}
	local svc4=10.96.0.1 svc6=fd00:96::1
	issue apiserver kube-apiserver "" \
		"DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:::1,IP:$API_V4,IP:$API_V6,IP:$svc4,IP:$svc6"
	issue admin admin system:masters ""
	issue kcm system:kube-controller-manager "" ""
	issue apiserver-kubelet-client kube-apiserver-kubelet-client system:masters ""
	issue front-proxy-client front-proxy-client "" ""
	openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
	openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
	chmod 600 "$pki"/*.key
	touch "$pki/.done-v2"
}

b64() { base64 -w0 <"$1"; }
write_kubeconfig() { # file server cert-name
	local f=$1 server=$2 c=$3
	(umask 077 && cat >"$f.tmp") <<EOF
apiVersion: v1
kind: Config
clusters:
- name: dsproxy-cp
  cluster:
    server: $server
    certificate-authority-data: $(b64 "$pki/ca.crt")
users:
- name: $c
  user:
    client-certificate-data: $(b64 "$pki/$c.crt")
    client-key-data: $(b64 "$pki/$c.key")
contexts:
- name: dsproxy-cp
  context:
    cluster: dsproxy-cp
    user: $c
current-context: dsproxy-cp
EOF
	mv "$f.tmp" "$f"
}

# --- netns ----------------------------------------------------------------
setup_cp_netns() {
	cp_ns_exists || ip netns add "$CP_NETNS"
	ip -n "$CP_NETNS" link set lo up
	if ! ip -n "$CP_NETNS" link show "$LINK_BR" >/dev/null 2>&1; then
		ip -n "$CP_NETNS" link add "$LINK_BR" type bridge
		ip -n "$CP_NETNS" addr add "$API_V4/24" dev "$LINK_BR"
		ip -n "$CP_NETNS" addr add "$API_V6/64" dev "$LINK_BR" nodad
	fi
	ip -n "$CP_NETNS" link set "$LINK_BR" up
	# Nodes' default routes point here and nothing is forwarded: a test that
	# probes an unrouted address sees the unreachable error of every attempt,
	# not only of those the ICMP rate limit lets through.
	ip netns exec "$CP_NETNS" sysctl -q -w net.ipv4.icmp_ratelimit=0 net.ipv6.icmp.ratelimit=0
}

# start NAME CMD...: runs CMD detached (own session) inside the cp netns.
start() {
	local name=$1
	shift
	# fd 8 is the lock: the daemons must not inherit it.
	setsid ip netns exec "$CP_NETNS" "$@" </dev/null >"$RUN/logs/$name.log" 2>&1 8>&- &
	echo $! >"$RUN/$name.pid"
}

wait_for() { # what timeout cmd...
	local what=$1 timeout=$2
	shift 2
	local deadline=$((SECONDS + timeout))
	until "$@" >/dev/null 2>&1; do
		if ! pid_alive "$what"; then
			log "$what exited; last log lines:"
			tail -n 30 "$RUN/logs/$what.log" >&2
			exit 1
		fi
		if [ "$SECONDS" -ge "$deadline" ]; then
			log "$what not healthy after ${timeout}s; last log lines:"
			tail -n 30 "$RUN/logs/$what.log" >&2
			exit 1
		fi
		sleep 0.3
	done
}

start_control_plane() {
	local t0=$SECONDS
	# Stale processes from a crashed run: stop them (pids we recorded).
	DSPROXY_CP_LOCKED=1 DSPROXY_CP_KEEP_NETNS=1 "$here/down.sh" >/dev/null 2>&1 || true
	setup_cp_netns
	gen_pki
	write_kubeconfig "$RUN/kubeconfig" "https://127.0.0.1:$API_PORT" admin
	mkdir -p "$RUN/logs"
	rm -rf "$ETCD_DATA"
	mkdir -p "$ETCD_DATA"
	chmod 700 "$ETCD_DATA"

	log "starting etcd ($("$ETCD" --version | head -1), $ETCD)"
	echo "$ETCD" >"$RUN/etcd-binary"
	start etcd "$ETCD" --name dsproxy-cp --data-dir "$ETCD_DATA" \
		--listen-client-urls http://127.0.0.1:2379 \
		--advertise-client-urls http://127.0.0.1:2379 \
		--listen-peer-urls http://127.0.0.1:2380 \
		--initial-advertise-peer-urls http://127.0.0.1:2380 \
		--initial-cluster dsproxy-cp=http://127.0.0.1:2380 \
		--listen-metrics-urls http://127.0.0.1:2381 \
		--snapshot-count 100000 --quota-backend-bytes 2147483648 \
		--logger zap --log-level warn
	wait_for etcd 30 cp_exec curl -fsS --max-time 2 http://127.0.0.1:2379/health

	log "starting kube-apiserver"
	start kube-apiserver "$BIN/kube-apiserver" \
		--etcd-servers=http://127.0.0.1:2379 \
		--bind-address=:: --secure-port="$API_PORT" \
		--advertise-address="$API_V4" \
		--tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
		--client-ca-file="$pki/ca.crt" \
		--kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" \
		--kubelet-client-key="$pki/apiserver-kubelet-client.key" \
		--service-account-issuer=https://kubernetes.default.svc.cluster.local \
		--service-account-key-file="$pki/sa.pub" \
		--service-account-signing-key-file="$pki/sa.key" \
		--service-cluster-ip-range="$SERVICE_CIDRS" \
		--requestheader-client-ca-file="$pki/ca.crt" \
		--requestheader-allowed-names=front-proxy-client \
		--requestheader-username-headers=X-Remote-User \
		--requestheader-group-headers=X-Remote-Group \
		--requestheader-extra-headers-prefix=X-Remote-Extra- \
		--proxy-client-cert-file="$pki/front-proxy-client.crt" \
		--proxy-client-key-file="$pki/front-proxy-client.key" \
		--authorization-mode=Node,RBAC \
		--enable-admission-plugins=NodeRestriction \
		--allow-privileged=true \
		--profiling=false \
		--v="${DSPROXY_CP_V:-1}"
	wait_for kube-apiserver 120 readyz 0

	write_kubeconfig "$RUN/kcm.kubeconfig" "https://127.0.0.1:$API_PORT" kcm
	log "starting kube-controller-manager"
	# Without kubelets, nodelifecycle would mark hand-made Nodes NotReady/unreachable
	# and taint-eviction would then evict (terminate) their pods after 5 min;
	# cloud controllers need a cloud provider.
	local controllers=${DSPROXY_CP_CONTROLLERS:-*,-node-lifecycle-controller,-taint-eviction-controller,-cloud-node-lifecycle-controller,-service-lb-controller,-node-route-controller}
	start kube-controller-manager "$BIN/kube-controller-manager" \
		--kubeconfig="$RUN/kcm.kubeconfig" \
		--authentication-kubeconfig="$RUN/kcm.kubeconfig" \
		--authorization-kubeconfig="$RUN/kcm.kubeconfig" \
		--bind-address=127.0.0.1 --secure-port=10257 \
		--leader-elect=false \
		--controllers="$controllers" \
		--use-service-account-credentials=true \
		--service-account-private-key-file="$pki/sa.key" \
		--root-ca-file="$pki/ca.crt" \
		--cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
		--allocate-node-cidrs=true \
		--cluster-cidr="$CLUSTER_CIDRS" \
		--service-cluster-ip-range="$SERVICE_CIDRS" \
		--node-cidr-mask-size-ipv4=24 --node-cidr-mask-size-ipv6=64 \
		--profiling=false \
		--v="${DSPROXY_CP_V:-1}"
	wait_for kube-controller-manager 60 \
		cp_exec curl -fsSk --max-time 2 https://127.0.0.1:10257/healthz
	# Pods cannot be created before the serviceaccount controller has made
	# "default" (ServiceAccount admission); wait for it in namespace default.
	wait_for kube-controller-manager 60 \
		cp_exec "$BIN/kubectl" --kubeconfig "$RUN/kubeconfig" -n default get serviceaccount default
	echo "${DSPROXY_CP_OWNER:-manual}" >"$RUN/started-by"
	log "control plane up in $((SECONDS - t0))s"
}

# --- links ----------------------------------------------------------------
link_ns() {
	local ns=$1 n dir=$RUN/links
	mkdir -p "$dir"
	case $ns in "$CP_NETNS" | "" | */*) log "bad link netns '$ns'"; exit 2 ;; esac
	if [ ! -e "/run/netns/$ns" ]; then
		ip netns add "$ns"
		touch "$dir/$ns.created"
	fi
	ip -n "$ns" link set lo up
	if [ -f "$dir/$ns" ]; then
		n=$(cat "$dir/$ns")
	else
		n=1
		while grep -qx "$n" "$dir"/* 2>/dev/null; do n=$((n + 1)); done
		[ "$n" -le 250 ] || { log "too many links"; exit 1; }
		echo "$n" >"$dir/$ns"
	fi
	local cpif=cpl$n v4=$LINK_V4_PREFIX.$((1 + n)) v6
	v6=${LINK_V6_PREFIX}:$(printf %x $((1 + n)))
	if ip -n "$ns" link show cplink >/dev/null 2>&1 &&
		ip -n "$CP_NETNS" link show "$cpif" >/dev/null 2>&1; then
		return 0
	fi
	ip -n "$ns" link del cplink >/dev/null 2>&1 || true
	ip -n "$CP_NETNS" link del "$cpif" >/dev/null 2>&1 || true
	ip -n "$CP_NETNS" link add "$cpif" type veth peer name cplink netns "$ns"
	ip -n "$CP_NETNS" link set "$cpif" master "$LINK_BR" up
	ip -n "$ns" addr add "$v4/24" dev cplink
	ip -n "$ns" addr add "$v6/64" dev cplink nodad
	ip -n "$ns" link set cplink up
	log "linked netns $ns: $v4 $v6 -> API https://$API_V4:$API_PORT"
}

# A running control plane is reused if its etcd is the one asked for. Otherwise it
# is restarted, unless another live process (a lease in $RUN/leases other than our
# caller's) is using it.
running_etcd=$(cat "$RUN/etcd-binary" 2>/dev/null || echo etcd)
if pid_alive etcd && pid_alive kube-apiserver && pid_alive kube-controller-manager && readyz 0; then
	if [ "$running_etcd" = "$ETCD" ]; then
		log "control plane already running (reused)"
		setup_cp_netns
	else
		for lease in "$RUN"/leases/*; do
			[ -e "$lease" ] || continue
			pid=${lease##*/}
			if [ "$pid" != "$PPID" ] && kill -0 "$pid" 2>/dev/null; then
				log "the running control plane (etcd $running_etcd) is in use by pid $pid; not restarting it with $ETCD"
				exit 1
			fi
		done
		log "restarting the control plane: etcd $ETCD asked for, $running_etcd running"
		start_control_plane
	fi
else
	start_control_plane
fi
write_kubeconfig "$RUN/kubeconfig" "https://127.0.0.1:$API_PORT" admin
write_kubeconfig "$RUN/kubeconfig.link" "https://$API_V4:$API_PORT" admin
write_kubeconfig "$RUN/kubeconfig.link6" "https://[$API_V6]:$API_PORT" admin
for ns in "${links[@]}"; do
	link_ns "$ns"
done
cat >"$RUN/env" <<EOF
DSPROXY_CP_NETNS=$CP_NETNS
DSPROXY_CP_RUN=$RUN
DSPROXY_CP_BIN=$BIN
DSPROXY_CP_KUBECONFIG=$RUN/kubeconfig
DSPROXY_CP_KUBECONFIG_LINK=$RUN/kubeconfig.link
DSPROXY_CP_KUBECONFIG_LINK6=$RUN/kubeconfig.link6
DSPROXY_CP_API_V4=$API_V4
DSPROXY_CP_API_V6=$API_V6
DSPROXY_CP_SERVICE_CIDRS=$SERVICE_CIDRS
DSPROXY_CP_CLUSTER_CIDRS=$CLUSTER_CIDRS
EOF
echo "$RUN/kubeconfig"
