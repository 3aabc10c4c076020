#!/usr/bin/env bash
# Prepares a kernel with IPVS for tests this machine's kernel cannot run: Debian's
# linux-image (6.1, ip_vs as modules), unpacked (never installed) into the cache,
# with modules.dep, and a busybox initramfs that mounts the host's root over 9p.
# hack/guest/run.sh boots it. Cached; safe to run again.
set -euo pipefail
cache=${DSPROXY_GUEST_CACHE:-/var/cache/dsproxy/guest}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$cache"
cd "$cache"
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] && /bin/busybox --list | grep -qx insmod || need+=(busybox-static)
command -v depmod >/dev/null || need+=(kmod)
command -v cpio >/dev/null || need+=(cpio)
if [ ${#need[@]} -gt 0 ]; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
if [ ! -f kernel.ok ]; then
	rm -rf k ./*.deb
	# The meta package names the current image package (linux-image-6.1.0-N-amd64).
	img=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}')
	if [ -z "$img" ]; then
		apt-get update -qq
		img=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
	fi
	[ -n "$img" ] || { echo "prepare.sh: no linux-image package in apt's lists" >&2; exit 1; }
	apt-get download "$img" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true
	dpkg-deb -x "$img"_*.deb k
	rm -f ./*.deb
	kver=$(ls k/lib/modules)
	depmod -b k "$kver"
	echo "$kver" >kernel.ok
fi
kver=$(cat kernel.ok)
if [ ! -f initrd.cpio.gz ] || [ "$here/init" -nt initrd.cpio.gz ] || [ "$0" -nt initrd.cpio.gz ]; then
	rm -rf initrd && mkdir -p initrd/bin initrd/m initrd/proc initrd/sys initrd/dev initrd/host initrd/out
	cp /bin/busybox initrd/bin/busybox
	cp "$here/init" initrd/init && chmod +x initrd/init
	# Only what mounting the host's root needs; the rest loads from there.
	for mod in virtio_pci 9pnet_virtio 9p; do
		modprobe -d k -S "$kver" --show-depends "$mod"
	done | awk '$1=="insmod" && !seen[$2]++ {print $2}' >initrd/m/order.full
	: >initrd/m/order
	while read -r ko; do
		cp "$ko" initrd/m/ && basename "$ko" >>initrd/m/order
	done <initrd/m/order.full
	rm initrd/m/order.full
	echo "$kver" >initrd/kver
	(cd initrd && find . | cpio -o -H newc --quiet | gzip -1) >initrd.cpio.gz
	rm -rf initrd
fi
echo "guest kernel $kver ready in $cache"
