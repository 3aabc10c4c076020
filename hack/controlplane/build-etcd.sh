#!/usr/bin/env bash
# Builds etcd ${ETCD_VERSION} (default: the version Kubernetes ${K8S_VERSION}
# itself requires, v3.6.8 for v1.36) from the Go module proxy with a throw-away
# wrapper module outside the repository, and prints the binary's path.
#
# Why: Debian's etcd-server (3.4.23) is older than Kubernetes 1.36 supports and
# lacks the watch progress requests the API server's streaming lists need
# (feature RequestWatchProgress), so informers fall back to one big LIST. Real
# clusters run etcd 3.5/3.6 and client-go 1.36 informers stream their initial
# list; the end-to-end benchmark uses this etcd so both proxies start as they do
# there. Use it with DSPROXY_CP_ETCD=$(hack/controlplane/build-etcd.sh).
#
# Output: ${DSPROXY_CACHE:-/var/cache/dsproxy}/etcd-${ETCD_VERSION}/bin/etcd
# (cached; ~20 s cold on 2 cores plus the module download).
set -euo pipefail

ETCD_VERSION=${ETCD_VERSION:-v3.6.8}
CACHE=${DSPROXY_CACHE:-/var/cache/dsproxy}
OUT=$CACHE/etcd-$ETCD_VERSION
BIN=$OUT/bin/etcd
export PATH=$PATH:/usr/local/go/bin

if [ -x "$BIN" ]; then
	echo "$BIN"
	exit 0
fi
mkdir -p "$OUT"
exec 9>"$OUT/.build.lock"
flock 9
if [ -x "$BIN" ]; then
	echo "$BIN"
	exit 0
fi
mod=$OUT/wrapper
rm -rf "$mod"
mkdir -p "$mod"
cd "$mod"
export GOWORK=off GOFLAGS=-mod=mod GO111MODULE=on
cat >go.mod <<EOT
module dsproxy.local/etcdbuild

go 1.24

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
EOT
cat >main.go <<'EOT'
// Command etcd is etcd's server main, built from the published server module.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOT
echo "build-etcd.sh: building etcd $ETCD_VERSION" >&2
go mod tidy >"$OUT/tidy.log" 2>&1 || { cat "$OUT/tidy.log" >&2; exit 1; }
mkdir -p "$OUT/bin"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$BIN.tmp" . >&2
mv "$BIN.tmp" "$BIN"
echo "$BIN"
