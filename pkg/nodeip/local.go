package nodeip

import (
	"cmp"
	"fmt"
	"net"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
)

// InterfaceAddr is one address configured on a local network interface.
type InterfaceAddr struct {
	Index int // interface index
	Name  string
	Addr  netip.Addr
}

// InterfaceLister lists the addresses of the host's interfaces that are up.
type InterfaceLister interface {
	InterfaceAddrs() ([]InterfaceAddr, error)
}

// HostInterfaces is the InterfaceLister of this host, using net.Interfaces. It
// leaves out interfaces that are down or loopback.
type HostInterfaces struct{}

// InterfaceAddrs implements InterfaceLister.
func (HostInterfaces) InterfaceAddrs() ([]InterfaceAddr, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing interfaces: %w", err)
	}
	var out []InterfaceAddr
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			return nil, fmt.Errorf("listing addresses of interface %s: %w", ifc.Name, err)
		}
		for _, a := range addrs {
			if ip, ok := ipOf(a); ok {
				out = append(out, InterfaceAddr{Index: ifc.Index, Name: ifc.Name, Addr: ip})
			}
		}
	}
	return out, nil
}

// ipOf converts an interface address to an unmapped netip.Addr.
func ipOf(a net.Addr) (netip.Addr, bool) {
	var ip net.IP
	switch v := a.(type) {
	case *net.IPNet:
		ip = v.IP
	case *net.IPAddr:
		ip = v.IP
	}
	addr, ok := netip.AddrFromSlice(ip)
	return addr.Unmap(), ok
}

// LocalAddresses returns the node IP candidates among l's addresses, as InternalIP
// Addresses: only global unicast addresses (never loopback, link-local, multicast or
// unspecified), unmapped, without zones or repeats. The order is deterministic:
// IPv4 before IPv6 (an unset --node-ip prefers IPv4), then by interface index, then
// by address.
func LocalAddresses(l InterfaceLister) ([]Address, error) {
	list, err := l.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("listing local addresses: %w", err)
	}
	var usable []InterfaceAddr
	for _, ia := range list {
		if ia.Addr.Zone() == "" && checkUsable(ia.Addr.Unmap()) == nil {
			ia.Addr = ia.Addr.Unmap()
			usable = append(usable, ia)
		}
	}
	slices.SortStableFunc(usable, func(a, b InterfaceAddr) int {
		return cmp.Or(cmp.Compare(a.Addr.BitLen(), b.Addr.BitLen()), cmp.Compare(a.Index, b.Index), a.Addr.Compare(b.Addr))
	})
	var out []Address
	for _, ia := range usable {
		if ad := (Address{Type: v1.NodeInternalIP, Addr: ia.Addr}); !slices.Contains(out, ad) {
			out = append(out, ad)
		}
	}
	return out, nil
}
