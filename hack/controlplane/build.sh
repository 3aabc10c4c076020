#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kube-proxy and kubectl of
# Kubernetes ${K8S_VERSION} from the Go module proxy, with a throw-away wrapper
# module that lives OUTSIDE the repository (the repo's go.mod is not touched).
#
# k8s.io/kubernetes cannot be `go build`-ed as a dependency by itself: its
# go.mod requires every staging module (k8s.io/api, client-go, ...) at v0.0.0
# and `replace`s them with ./staging/src/...  Replace directives of a
# dependency are ignored, so the wrapper must replace each of those modules
# with its published tag v0.<minor>.<patch>. The list is derived from
# k8s.io/kubernetes' own go.mod: every module that is both in its `replace`
# section (pointing at ./staging) and required at v0.0.0.
#
# Output: ${DSPROXY_CACHE:-/var/cache/dsproxy}/k8s-${K8S_VERSION}/bin/
# Skipped when all binaries are already there (delete the dir, or pass
# --force, to rebuild). Cold: ~6-7 min on 2 cores.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.36.3}
CACHE=${DSPROXY_CACHE:-/var/cache/dsproxy}
OUT=$CACHE/k8s-$K8S_VERSION
BIN=$OUT/bin
CMDS=(kube-apiserver kube-controller-manager kube-proxy kubectl)
export PATH=$PATH:/usr/local/go/bin

force=0
[ "${1:-}" = "--force" ] && force=1

have_all() {
	local c
	for c in "${CMDS[@]}"; do
		[ -x "$BIN/$c" ] || return 1
	done
}

if [ "$force" = 0 ] && have_all; then
	echo "build.sh: cached binaries in $BIN"
	exit 0
fi

# One build at a time (tests may call up.sh concurrently).
mkdir -p "$OUT"
exec 9>"$OUT/.build.lock"
flock 9
if [ "$force" = 0 ] && have_all; then
	echo "build.sh: cached binaries in $BIN"
	exit 0
fi

staging_ver="v0.${K8S_VERSION#v1.}"
mod=$OUT/wrapper
rm -rf "$mod"
mkdir -p "$mod"
cd "$mod"
# The wrapper must not pick up a parent go.work / the repo's go.mod.
export GOWORK=off GOFLAGS=-mod=mod GO111MODULE=on

kgomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
	sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
[ -f "$kgomod" ] || { echo "build.sh: cannot download k8s.io/kubernetes@$K8S_VERSION" >&2; exit 1; }

# staging modules: in replace => ./staging/... AND required at v0.0.0
mapfile -t staged < <(awk '
	/^replace \(/ { inrep = 1; next }
	/^require \(/ { inreq = 1; next }
	/^\)/ { inrep = 0; inreq = 0; next }
	inrep && $2 == "=>" && $3 ~ /^\.\/staging\// { rep[$1] = 1 }
	inreq && $2 == "v0.0.0" { req[$1] = 1 }
	END { for (m in rep) if (m in req) print m }' "$kgomod" | sort)
[ "${#staged[@]}" -gt 10 ] || { echo "build.sh: could not parse staging modules from $kgomod" >&2; exit 1; }

gover=$(awk '$1 == "go" { print $2; exit }' "$kgomod")
{
	echo "module dsproxy.local/k8sbuild"
	echo
	echo "go $gover"
	echo
	echo "godebug default=go${gover%.*}"
	echo
	echo "require k8s.io/kubernetes $K8S_VERSION"
	echo
	echo "replace ("
	for m in "${staged[@]}"; do
		echo "	$m => $m $staging_ver"
	done
	echo ")"
} >go.mod
cat >tools.go <<EOT
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
EOT
echo "build.sh: resolving modules (${#staged[@]} staging modules at $staging_ver)"
go mod tidy -e >/dev/null 2>"$OUT/tidy.log" || { cat "$OUT/tidy.log" >&2; exit 1; }

major=${K8S_VERSION#v}; major=${major%%.*}
minor=${K8S_VERSION#v*.}; minor=${minor%%.*}
ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
	ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done

echo "build.sh: go build ${CMDS[*]} (cold: several minutes)"
start=$(date +%s)
mkdir -p "$BIN.tmp"
pkgs=()
for c in "${CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$BIN.tmp/" "${pkgs[@]}"
rm -rf "$BIN"
mv "$BIN.tmp" "$BIN"
echo "build.sh: built in $(($(date +%s) - start))s -> $BIN"
