#!/usr/bin/env bash
# Installs what dsproxy's tests and demo need on a fresh Debian machine: kernel
# userspace tools for inspection, etcd for the control plane, staticcheck, and the Go
# modules. Safe to run again.
set -euo pipefail
pkgs=(nftables iptables iproute2 conntrack etcd-server curl socat ipset)
missing=()
for p in "${pkgs[@]}"; do
	dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Debian starts etcd as a service on install; the tests run their own.
systemctl disable --now etcd >/dev/null 2>&1 || true
gobin=$(go env GOPATH)/bin
[ -x "$gobin/staticcheck" ] || GOFLAGS= go install honnef.co/go/tools/cmd/staticcheck@v0.6.1 # release 2025.1.1, by its module version (the proxy may refuse the tag)
go mod download
