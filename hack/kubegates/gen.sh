#!/usr/bin/env bash
# Regenerates pkg/config/kubegates.go: kube-proxy's feature gates, read from
# kube-proxy ${K8S_VERSION} itself (main.go, run inside the control plane's
# build module, which build.sh makes). --check compares instead of writing and
# fails when the file is not what kube-proxy registers.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
K8S_VERSION=${K8S_VERSION:-v1.36.3}
CACHE=${DSPROXY_CACHE:-/var/cache/dsproxy}
mod=$CACHE/k8s-$K8S_VERSION/wrapper
export PATH=$PATH:/usr/local/go/bin
"$repo/hack/controlplane/build.sh" >&2
[ -f "$mod/go.mod" ] || { echo "gen.sh: no build module at $mod (run hack/controlplane/build.sh --force)" >&2; exit 1; }
mkdir -p "$mod/kubegates"
cp "$here/main.go" "$mod/kubegates/main.go"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
(cd "$mod" && GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0 go run -trimpath kubegates/main.go "$K8S_VERSION") >"$out"
target=$repo/pkg/config/kubegates.go
if [ "${1:-}" = "--check" ]; then
	diff -u "$target" "$out" >&2 || { echo "gen.sh: $target is not kube-proxy $K8S_VERSION's gates; run hack/kubegates/gen.sh" >&2; exit 1; }
	echo "gen.sh: $target matches kube-proxy $K8S_VERSION"
	exit 0
fi
cp "$out" "$target"
echo "gen.sh: wrote $target"
