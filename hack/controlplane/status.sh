#!/usr/bin/env bash
# Reports the state of the control plane started by up.sh.
#
# Usage: status.sh [--wait SECONDS] [--quiet]
#   exit 0 when kube-apiserver /readyz answers ok (within SECONDS with --wait),
#   exit 1 otherwise.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=hack/controlplane/lib.sh
. "$here/lib.sh"

wait=0 quiet=0
while [ $# -gt 0 ]; do
	case $1 in
	--wait) wait=$2; shift 2 ;;
	--quiet | -q) quiet=1; shift ;;
	*) echo "status.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done

ok=0
readyz "$wait" || ok=1
[ "$quiet" = 1 ] && exit $ok

say() { printf '%-26s %s\n' "$1" "$2"; }
if cp_ns_exists; then say netns "$CP_NETNS present"; else say netns "$CP_NETNS absent"; fi
for p in etcd kube-apiserver kube-controller-manager; do
	if pid=$(our_pid "$p"); then say "$p" "running (pid $pid)"; else say "$p" "not running"; fi
done
if [ $ok = 0 ]; then
	say readyz ok
	cp_exec curl -fsS --max-time 3 --cacert "$RUN/pki/ca.crt" --cert "$RUN/pki/admin.crt" \
		--key "$RUN/pki/admin.key" "https://127.0.0.1:$API_PORT/version" |
		sed -n 's/.*"gitVersion": "\(.*\)".*/\1/p' | while read -r v; do say version "$v"; done
else
	say readyz "NOT ready"
fi
if [ -d "$RUN/links" ]; then
	for f in "$RUN"/links/*; do
		[ -e "$f" ] || continue
		case $f in *.created) continue ;; esac
		ns=$(basename "$f")
		if ip -n "$ns" link show cplink >/dev/null 2>&1; then st=up; else st=missing; fi
		say "link $ns" "$LINK_V4_PREFIX.$((1 + $(cat "$f"))) ($st)"
	done
fi
say kubeconfig "$RUN/kubeconfig (inside $CP_NETNS)"
say kubeconfig.link "$RUN/kubeconfig.link (inside linked netns)"
say logs "$RUN/logs/"
exit $ok
