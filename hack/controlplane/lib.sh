# shellcheck shell=bash disable=SC2034
# Shared settings for hack/controlplane/*.sh. Sourced, not run.
#
# Everything can be overridden from the environment:
#   DSPROXY_CACHE      binary cache root          (/var/cache/dsproxy)
#   K8S_VERSION        Kubernetes version          (v1.36.3)
#   DSPROXY_CP_NETNS   control-plane netns name    (dsproxy-cp)
#   DSPROXY_CP_RUN     run dir: certs, kubeconfigs, logs, pids (/tmp/dsproxy-cp)
#   DSPROXY_CP_ETCD_DATA  etcd data dir (tmpfs if /dev/shm exists)
#   DSPROXY_CP_ETCD    etcd binary (etcd from PATH: Debian's etcd-server; see
#                      build-etcd.sh for Kubernetes' own etcd version)

K8S_VERSION=${K8S_VERSION:-v1.36.3}
CACHE=${DSPROXY_CACHE:-/var/cache/dsproxy}
BIN=$CACHE/k8s-$K8S_VERSION/bin
CP_NETNS=${DSPROXY_CP_NETNS:-dsproxy-cp}
RUN=${DSPROXY_CP_RUN:-/tmp/dsproxy-cp}
if [ -z "${DSPROXY_CP_ETCD_DATA:-}" ]; then
	if [ -d /dev/shm ] && [ -w /dev/shm ]; then
		DSPROXY_CP_ETCD_DATA=/dev/shm/${CP_NETNS}-etcd
	else
		DSPROXY_CP_ETCD_DATA=$RUN/etcd-data
	fi
fi
ETCD_DATA=$DSPROXY_CP_ETCD_DATA
ETCD=${DSPROXY_CP_ETCD:-etcd}

# Addressing. The API server listens on all addresses of the cp netns, port 6443.
# A bridge in the cp netns carries the "link" network that other namespaces
# (tests' node namespaces) join via veth pairs:
#   cp side:        172.31.255.1/24  fd00:ffff::1/64   (bridge cpbr0)
#   n-th link:      172.31.255.(1+n)/24  fd00:ffff::(1+n)/64, n = 1, 2, ...
#                   (the first linked namespace gets .2 / ::2)
LINK_BR=cpbr0
LINK_V4_PREFIX=172.31.255
LINK_V6_PREFIX=fd00:ffff:
API_PORT=6443
API_V4=$LINK_V4_PREFIX.1
API_V6=${LINK_V6_PREFIX}:1
SERVICE_CIDRS=${DSPROXY_CP_SERVICE_CIDRS:-10.96.0.0/16,fd00:96::/112}
CLUSTER_CIDRS=${DSPROXY_CP_CLUSTER_CIDRS:-10.64.0.0/16,fd00:64::/56}

LOCK=$RUN.lock

cp_exec() { ip netns exec "$CP_NETNS" "$@"; }

cp_ns_exists() { [ -e "/run/netns/$CP_NETNS" ]; }

# readyz [timeout-seconds]: polls https://127.0.0.1:6443/readyz inside the cp netns.
readyz() {
	local deadline=$((SECONDS + ${1:-0}))
	while :; do
		if cp_ns_exists && [ -f "$RUN/pki/admin.crt" ] &&
			cp_exec curl -fsS --max-time 3 --cacert "$RUN/pki/ca.crt" \
				--cert "$RUN/pki/admin.crt" --key "$RUN/pki/admin.key" \
				"https://127.0.0.1:$API_PORT/readyz" >/dev/null 2>&1; then
			return 0
		fi
		[ "$SECONDS" -ge "$deadline" ] && return 1
		sleep 0.5
	done
}

# our_pid NAME: prints the pid recorded in $RUN/NAME.pid if that process is
# alive and still is NAME (a stale pid file must never make us signal an
# unrelated process that reused the pid).
our_pid() {
	local f=$RUN/$1.pid pid
	[ -f "$f" ] || return 1
	pid=$(cat "$f")
	[ -n "$pid" ] || return 1
	# A process reads an empty command line for a moment while it execs (as
	# setsid and `ip netns exec` do right after start): look again then.
	local cmd
	for _ in 1 2 3 4 5; do
		cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
		[ -n "$cmd" ] && break
		sleep 0.05
	done
	case "$cmd" in
	*"$1 "*) echo "$pid" ;;
	*) return 1 ;;
	esac
}

pid_alive() { our_pid "$1" >/dev/null; }

with_lock() {
	mkdir -p "$(dirname "$LOCK")"
	exec 8>"$LOCK"
	flock 8
}
