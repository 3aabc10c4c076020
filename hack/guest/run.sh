#!/usr/bin/env bash
# Runs a command in a qemu guest booted with the kernel hack/guest/prepare.sh
# unpacked (software emulation, ~20 s to boot): the guest sees the host's
# filesystem read-only, the current directory as its working directory, and
# writable tmpfs /tmp and /run. Exits with the command's status.
#   hack/guest/run.sh [-m MiB] [-e VAR ...] -- command args...
# Environment variables named with -e are passed in.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${DSPROXY_GUEST_CACHE:-/var/cache/dsproxy/guest}
mem=2048
envs=()
while [ $# -gt 0 ]; do
	case $1 in
	-m) mem=$2; shift 2 ;;
	-e) envs+=("$2"); shift 2 ;;
	--) shift; break ;;
	*) break ;;
	esac
done
[ $# -gt 0 ] || { echo "usage: run.sh [-m MiB] [-e VAR] -- command..." >&2; exit 2; }
"$here/prepare.sh" >/dev/null
kver=$(cat "$cache/kernel.ok")
out=$(mktemp -d /tmp/dsproxy-guest.XXXXXX)
trap 'rm -rf "$out"' EXIT
pwd >"$out/cwd"
: >"$out/env"
for v in PATH "${envs[@]}"; do
	[ -n "${!v+x}" ] && printf 'export %s=%q\n' "$v" "${!v}" >>"$out/env"
done
printf '%q ' "$@" >"$out/cmd"
echo >>"$out/cmd"
timeout --foreground "${DSPROXY_GUEST_TIMEOUT:-3600}" qemu-system-x86_64 -accel tcg -cpu max -smp 2 -m "$mem" \
	-kernel "$cache/k/boot/vmlinuz-$kver" -initrd "$cache/initrd.cpio.gz" \
	-append "console=ttyS0 quiet loglevel=3 panic=-1 dsproxy.cache=$cache" \
	-virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
	-virtfs local,path="$out",mount_tag=out,security_model=none \
	-nographic -no-reboot -nic none </dev/null
[ -f "$out/rc" ] || { echo "run.sh: the guest wrote no exit status" >&2; exit 1; }
exit "$(cat "$out/rc")"
