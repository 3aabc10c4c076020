#!/usr/bin/env bash
# Stops the control plane started by up.sh and deletes its network namespace
# (dsproxy-cp) and the linked namespaces that up.sh itself created. Linked
# namespaces the caller created are kept (their "cplink" veth disappears with
# dsproxy-cp). Idempotent: safe to run when nothing is up.
#
# Usage: down.sh [--purge]   --purge also removes the run dir (certs, logs).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=hack/controlplane/lib.sh
. "$here/lib.sh"

purge=0
[ "${1:-}" = "--purge" ] && purge=1
[ "$(id -u)" = 0 ] || { echo "down.sh: must run as root" >&2; exit 1; }

# up.sh calls us while holding the lock already.
[ -n "${DSPROXY_CP_LOCKED:-}" ] || { [ -d "$(dirname "$LOCK")" ] && with_lock; }

# The processes we recorded: SIGTERM all, SIGKILL what is left after 2s.
# Nothing here needs a graceful shutdown (etcd's data is thrown away), and
# kube-apiserver alone would take 3s to drain.
pids=()
for name in kube-controller-manager kube-apiserver etcd; do
	f=$RUN/$name.pid
	if pid=$(our_pid "$name"); then
		kill "$pid" 2>/dev/null || true
		pids+=("$pid")
		echo "down.sh: stopping $name (pid $pid)" >&2
	fi
	rm -f "$f"
done
for _ in $(seq 1 20); do
	alive=0
	for pid in "${pids[@]}"; do
		if kill -0 "$pid" 2>/dev/null; then alive=1; fi
	done
	[ "$alive" = 0 ] && break
	sleep 0.1
done
for pid in "${pids[@]}"; do
	kill -9 "$pid" 2>/dev/null || true
done

if cp_ns_exists; then
	# Anything else still running inside our own namespace was started there
	# through these scripts (e.g. a kubectl.sh exec); stop those by pid.
	for pid in $(ip netns pids "$CP_NETNS" 2>/dev/null); do
		kill "$pid" 2>/dev/null || true
	done
fi

rm -rf "$ETCD_DATA"
rm -f "$RUN/started-by"

if [ -z "${DSPROXY_CP_KEEP_NETNS:-}" ]; then
	if [ -d "$RUN/links" ]; then
		for f in "$RUN"/links/*; do
			[ -e "$f" ] || continue
			case $f in *.created) continue ;; esac
			ns=$(basename "$f")
			if [ -e "$RUN/links/$ns.created" ]; then
				ip netns del "$ns" 2>/dev/null || true
			else
				ip -n "$ns" link del cplink 2>/dev/null || true
			fi
			rm -f "$f" "$RUN/links/$ns.created"
		done
	fi
	if cp_ns_exists; then
		ip netns del "$CP_NETNS"
		echo "down.sh: deleted netns $CP_NETNS" >&2
	fi
fi
if [ "$purge" = 1 ]; then
	rm -rf "$RUN" "$LOCK"
fi
exit 0
