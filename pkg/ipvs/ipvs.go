// Package ipvs is the kernel side of dsproxy's IPVS mode for one family: IPVS
// virtual servers and their real servers (github.com/moby/ipvs), the dummy link
// that holds the Service addresses, and ipsets (github.com/vishvananda/netlink),
// all over netlink, in the network namespace the Kernel was opened in.
package ipvs

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	mipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// LinkName is the dummy interface the Service addresses are bound to, as
// kube-proxy's kube-ipvs0.
const LinkName = "dsproxy-ipvs0"

// KubeProxyLinkName is kube-proxy's IPVS mode's dummy link, which holds Service
// addresses until dsproxy removes it.
const KubeProxyLinkName = "kube-ipvs0"

// Key identifies a virtual server: address, IP protocol number and port.
type Key struct {
	Addr  netip.Addr
	Proto uint8
	Port  uint16
}

// Compare orders keys by address, then protocol, then port.
func (k Key) Compare(o Key) int {
	if c := k.Addr.Compare(o.Addr); c != 0 {
		return c
	}
	if c := cmp.Compare(k.Proto, o.Proto); c != 0 {
		return c
	}
	return cmp.Compare(k.Port, o.Port)
}

func (k Key) String() string {
	return fmt.Sprintf("%s/%s", protoName(k.Proto), netip.AddrPortFrom(k.Addr, k.Port))
}

// protoNames names the protocols of Services.
var protoNames = map[uint8]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp", unix.IPPROTO_SCTP: "sctp"}

func protoName(p uint8) string {
	if n, ok := protoNames[p]; ok {
		return n
	}
	return strconv.Itoa(int(p))
}

// Service is a virtual server's settings.
type Service struct {
	Key
	Scheduler string
	// Persistent makes the scheduler send a client to the same real server for
	// Timeout seconds (ClientIP session affinity).
	Persistent bool
	Timeout    uint32
	// HashPort (IP_VS_SVC_F_SCHED_MH_PORT) makes the mh scheduler hash the
	// source port with the source address, as kube-proxy sets it for mh.
	HashPort bool
}

// Dest is a real server; Active and Inactive are the kernel's connection counts
// (read only).
type Dest struct {
	Addr             netip.Addr
	Port             uint16
	Weight           int
	Active, Inactive int
}

// Entry is an ipset member: IP, then for port types Proto and Port, then IP2
// (with CIDR2 for a net) for the three-part types.
type Entry struct {
	IP    netip.Addr
	Proto uint8
	Port  uint16
	IP2   netip.Addr
	CIDR2 uint8
}

// Kernel is one family's IPVS-mode kernel state in one network namespace.
type Kernel struct {
	f    *family.Family
	ipvs *mipvs.Handle
	nl   *netlink.Handle
}

// Open connects to the kernel in the network namespace of nsPath ("" for the
// caller's). Asking the kernel for IPVS loads the ip_vs module where modprobe
// can. With needIPVS false a kernel whose IPVS is not loaded is not asked
// (cleaning up where nothing can be left must not load it): that Kernel lists no
// virtual servers and fails to create one.
func Open(f *family.Family, nsPath string, needIPVS bool) (*Kernel, error) {
	ns := netns.None()
	if nsPath != "" {
		var err error
		if ns, err = netns.GetFromPath(nsPath); err != nil {
			return nil, err
		}
		defer ns.Close()
	}
	k := &Kernel{f: f}
	if needIPVS || ipvsLoaded() {
		h, err := mipvs.New(nsPath)
		if err != nil {
			return nil, fmt.Errorf("ipvs: %w (is the ip_vs module loaded?)", err)
		}
		k.ipvs = h
	}
	nlh, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE, unix.NETLINK_NETFILTER)
	if err != nil {
		k.Close()
		return nil, err
	}
	k.nl = nlh
	return k, nil
}

// ipvsLoaded reports whether the kernel has IPVS loaded: the module, once
// loaded, has /proc/net/ip_vs in every namespace.
func ipvsLoaded() bool {
	_, err := os.Stat("/proc/net/ip_vs")
	return err == nil
}

// IPSetLoaded reports whether the kernel has ipset loaded: listing sets where it
// is not would load it.
func IPSetLoaded() bool {
	_, err := os.Stat("/sys/module/ip_set")
	return err == nil
}

var errNoIPVS = errors.New("ipvs: the kernel's IPVS is not loaded")

// Close releases the netlink sockets.
func (k *Kernel) Close() {
	if k.ipvs != nil {
		k.ipvs.Close()
	}
	if k.nl != nil {
		k.nl.Close()
	}
}

// SetTimeouts sets IPVS's connection timeouts; a zero one is left as it is.
func (k *Kernel) SetTimeouts(tcp, tcpFin, udp time.Duration) error {
	if k.ipvs == nil {
		return errNoIPVS
	}
	if tcp == 0 && tcpFin == 0 && udp == 0 {
		return nil
	}
	if err := k.ipvs.SetConfig(&mipvs.Config{TimeoutTCP: tcp, TimeoutTCPFin: tcpFin, TimeoutUDP: udp}); err != nil {
		return fmt.Errorf("ipvs: setting timeouts: %w", err)
	}
	return nil
}

// Timeouts returns IPVS's connection timeouts (ipvsadm -L --timeout).
func (k *Kernel) Timeouts() (tcp, tcpFin, udp time.Duration, err error) {
	if k.ipvs == nil {
		return 0, 0, 0, errNoIPVS
	}
	c, err := k.ipvs.GetConfig()
	if err != nil {
		return 0, 0, 0, fmt.Errorf("ipvs: reading timeouts: %w", err)
	}
	return c.TimeoutTCP, c.TimeoutTCPFin, c.TimeoutUDP, nil
}

func (k *Kernel) af() uint16 { return uint16(k.f.NFProto) }

func (k *Kernel) mipvsService(s Service) *mipvs.Service {
	out := &mipvs.Service{
		Address: net.IP(s.Addr.AsSlice()), Protocol: uint16(s.Proto), Port: s.Port,
		SchedName: s.Scheduler, AddressFamily: k.af(), Netmask: 0xffffffff,
	}
	if k.f.BitLen == 128 {
		out.Netmask = 128
	}
	if s.Persistent {
		out.Flags, out.Timeout = 1, s.Timeout // IP_VS_SVC_F_PERSISTENT
	}
	if s.HashPort {
		out.Flags |= mhPortFlag
	}
	return out
}

// mhPortFlag is IP_VS_SVC_F_SCHED_MH_PORT (IP_VS_SVC_F_SCHED2).
const mhPortFlag = 0x10

// probeService is the virtual server CheckScheduler adds and deletes at once: a
// TEST-NET-2 address (RFC 5737), as kube-proxy's probe uses.
var probeService = Key{Addr: netip.MustParseAddr("198.51.100.0"), Proto: 6, Port: 20000}

// CheckScheduler checks that IPVS has the scheduler name (kube-proxy's
// --ipvs-scheduler check): some virtual server of the family uses it already,
// or a probe virtual server can be created with it (and is deleted again). A
// kernel without the scheduler's module refuses it; without the check every
// sync would fail. It is meant for the IPv4 Kernel.
func (k *Kernel) CheckScheduler(name string) error {
	if k.f.BitLen != 32 {
		return fmt.Errorf("ipvs: CheckScheduler needs the IPv4 Kernel")
	}
	svcs, err := k.Services()
	if err != nil {
		return err
	}
	for _, s := range svcs {
		if s.Scheduler == name {
			return nil
		}
	}
	if err := k.AddService(Service{Key: probeService, Scheduler: name}); err != nil {
		return fmt.Errorf("ipvs: scheduler %q is not available (is the ip_vs_%s module?): %w", name, name, err)
	}
	return k.DelService(probeService)
}

// Services lists the family's virtual servers (not firewall-mark ones).
func (k *Kernel) Services() ([]Service, error) {
	if k.ipvs == nil {
		return nil, nil
	}
	svcs, err := k.ipvs.GetServices()
	if err != nil {
		return nil, fmt.Errorf("ipvs: listing services: %w", err)
	}
	out := make([]Service, 0, len(svcs))
	for _, s := range svcs {
		if s.AddressFamily != k.af() || s.FWMark != 0 {
			continue
		}
		a, ok := netip.AddrFromSlice(s.Address)
		if !ok {
			continue
		}
		a = a.Unmap()
		if k.f.BitLen == 128 {
			a = netip.AddrFrom16(a.As16())
		}
		out = append(out, Service{Key: Key{Addr: a, Proto: uint8(s.Protocol), Port: s.Port},
			Scheduler: s.SchedName, Persistent: s.Flags&1 != 0, Timeout: s.Timeout, HashPort: s.Flags&mhPortFlag != 0})
	}
	return out, nil
}

// AddService creates a virtual server.
func (k *Kernel) AddService(s Service) error {
	if k.ipvs == nil {
		return errNoIPVS
	}
	return wrap("adding", s.Key, k.ipvs.NewService(k.mipvsService(s)))
}

// UpdateService changes a virtual server's settings.
func (k *Kernel) UpdateService(s Service) error {
	if k.ipvs == nil {
		return errNoIPVS
	}
	return wrap("updating", s.Key, k.ipvs.UpdateService(k.mipvsService(s)))
}

// DelService deletes a virtual server with its real servers.
func (k *Kernel) DelService(s Key) error {
	if k.ipvs == nil {
		return errNoIPVS
	}
	return wrap("deleting", s, k.ipvs.DelService(k.mipvsService(Service{Key: s})))
}

func wrap(what string, key Key, err error) error {
	if err != nil {
		return fmt.Errorf("ipvs: %s virtual server %s: %w", what, key, err)
	}
	return nil
}

// Dests lists a virtual server's real servers.
func (k *Kernel) Dests(s Key) ([]Dest, error) {
	if k.ipvs == nil {
		return nil, errNoIPVS
	}
	ds, err := k.ipvs.GetDestinations(k.mipvsService(Service{Key: s}))
	if err != nil {
		return nil, wrap("listing the real servers of", s, err)
	}
	out := make([]Dest, 0, len(ds))
	for _, d := range ds {
		a, ok := netip.AddrFromSlice(d.Address)
		if !ok {
			continue
		}
		a = a.Unmap()
		if k.f.BitLen == 128 {
			a = netip.AddrFrom16(a.As16())
		}
		out = append(out, Dest{Addr: a, Port: d.Port, Weight: d.Weight,
			Active: d.ActiveConnections, Inactive: d.InactiveConnections})
	}
	return out, nil
}

func (k *Kernel) mipvsDest(d Dest) *mipvs.Destination {
	return &mipvs.Destination{Address: net.IP(d.Addr.AsSlice()), Port: d.Port, Weight: d.Weight,
		ConnectionFlags: mipvs.ConnectionFlagMasq, AddressFamily: k.af()}
}

// AddDest adds a real server to s.
func (k *Kernel) AddDest(s Key, d Dest) error {
	if k.ipvs == nil {
		return errNoIPVS
	}
	return wrap("adding a real server to", s, k.ipvs.NewDestination(k.mipvsService(Service{Key: s}), k.mipvsDest(d)))
}

// UpdateDest changes a real server's weight.
func (k *Kernel) UpdateDest(s Key, d Dest) error {
	if k.ipvs == nil {
		return errNoIPVS
	}
	return wrap("updating a real server of", s, k.ipvs.UpdateDestination(k.mipvsService(Service{Key: s}), k.mipvsDest(d)))
}

// DelDest removes a real server from s.
func (k *Kernel) DelDest(s Key, d Dest) error {
	if k.ipvs == nil {
		return errNoIPVS
	}
	return wrap("deleting a real server of", s, k.ipvs.DelDestination(k.mipvsService(Service{Key: s}), k.mipvsDest(d)))
}

// link returns the dummy link, creating it when create is set (nil, nil when it
// does not exist and create is not set).
func (k *Kernel) link(create bool) (netlink.Link, error) {
	l, err := k.nl.LinkByName(LinkName)
	var nf netlink.LinkNotFoundError
	switch {
	case err == nil:
		return l, nil
	case !errors.As(err, &nf):
		return nil, fmt.Errorf("link %s: %w", LinkName, err)
	case !create:
		return nil, nil
	}
	if err := k.nl.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: LinkName}}); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("creating link %s: %w", LinkName, err)
	}
	if l, err = k.nl.LinkByName(LinkName); err != nil {
		return nil, fmt.Errorf("link %s: %w", LinkName, err)
	}
	return l, nil
}

// EnsureLink creates the dummy link unless it exists, and sets it up: IPv6
// installs local routes only for addresses on a link that is up. A dummy link
// sends nothing, so being up answers nothing on the network.
func (k *Kernel) EnsureLink() (created bool, err error) {
	l, err := k.link(false)
	if err != nil {
		return false, err
	}
	if l == nil {
		created = true
		if l, err = k.link(true); err != nil {
			return false, err
		}
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		if err := k.nl.LinkSetUp(l); err != nil {
			return created, fmt.Errorf("setting %s up: %w", LinkName, err)
		}
	}
	return created, nil
}

// KernelOwnAddr reports whether a is an address the kernel gives the dummy link
// itself (an IPv6 link-local one), not one a proxy bound: Addrs leaves these
// out, as kube-proxy's IPVS mode leaves them out of the addresses it reads
// back. An IPv4 link-local address there is a proxy's.
func KernelOwnAddr(a netip.Addr) bool { return a.Is6() && !a.Is4In6() && a.IsLinkLocalUnicast() }

// Addrs lists the family's addresses on the dummy link (none when it is
// missing), but for the kernel's own (KernelOwnAddr).
func (k *Kernel) Addrs() ([]netip.Addr, error) {
	l, err := k.link(false)
	if err != nil || l == nil {
		return nil, err
	}
	as, err := RetryDump(func() ([]netlink.Addr, error) { return k.nl.AddrList(l, int(k.af())) })
	if err != nil {
		return nil, fmt.Errorf("addresses of %s: %w", LinkName, err)
	}
	out := make([]netip.Addr, 0, len(as))
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && !KernelOwnAddr(ip) {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

func (k *Kernel) nlAddr(a netip.Addr) *netlink.Addr {
	na := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}}
	if a.Is6() {
		na.Flags = unix.IFA_F_NODAD
	}
	return na
}

// AddAddr binds a to the dummy link.
func (k *Kernel) AddAddr(a netip.Addr) error {
	l, err := k.link(true)
	if err != nil {
		return err
	}
	if err := k.nl.AddrAdd(l, k.nlAddr(a)); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("binding %s to %s: %w", a, LinkName, err)
	}
	return nil
}

// DelAddr unbinds a from the dummy link.
func (k *Kernel) DelAddr(a netip.Addr) error {
	l, err := k.link(false)
	if err != nil || l == nil {
		return err
	}
	if err := k.nl.AddrDel(l, k.nlAddr(a)); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
		return fmt.Errorf("unbinding %s from %s: %w", a, LinkName, err)
	}
	return nil
}

// DeleteLinkIfEmpty deletes the dummy link when it holds no address of either
// family (the other family's backend may still use it).
func (k *Kernel) DeleteLinkIfEmpty() error {
	l, err := k.link(false)
	if err != nil || l == nil {
		return err
	}
	as, err := RetryDump(func() ([]netlink.Addr, error) { return k.nl.AddrList(l, netlink.FAMILY_ALL) })
	if err != nil {
		return fmt.Errorf("addresses of %s: %w", LinkName, err)
	}
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP); !ok || !KernelOwnAddr(ip) {
			return nil
		}
	}
	return k.nl.LinkDel(l)
}

// EnsureSet creates the ipset unless it exists. typ is a hash type of the
// family ("hash:ip,port").
func (k *Kernel) EnsureSet(name, typ string) error {
	opts := netlink.IpsetCreateOptions{Family: k.f.NFProto, Replace: true}
	if err := k.nl.IpsetCreate(name, typ, opts); err != nil && !errors.Is(err, nl.IPSetError(nl.IPSET_ERR_EXIST)) {
		return fmt.Errorf("ipset %s (%s): creating: %w", name, typ, err)
	}
	return nil
}

// DestroySet removes the ipset; a missing one is not an error.
func (k *Kernel) DestroySet(name string) error {
	if err := k.nl.IpsetDestroy(name); err != nil && !isMissingSet(err) {
		return fmt.Errorf("ipset %s: destroying: %w", name, err)
	}
	return nil
}

func isMissingSet(err error) bool {
	return errors.Is(err, unix.ENOENT) || strings.Contains(err.Error(), "does not exist")
}

// Sets lists the names of every ipset in the namespace.
func (k *Kernel) Sets() ([]string, error) {
	all, err := RetryDump(k.nl.IpsetListAll)
	if err != nil {
		return nil, fmt.Errorf("listing ipsets: %w", err)
	}
	out := make([]string, 0, len(all))
	for _, s := range all {
		out = append(out, s.SetName)
	}
	return out, nil
}

// Entries lists an ipset's members (nil when the set is missing).
func (k *Kernel) Entries(name string) ([]Entry, bool, error) {
	r, err := RetryDump(func() (*netlink.IPSetResult, error) { return k.nl.IpsetList(name) })
	if err != nil {
		if isMissingSet(err) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("ipset %s: listing: %w", name, err)
	}
	out := make([]Entry, 0, len(r.Entries))
	for _, e := range r.Entries {
		var x Entry
		if ip, ok := netip.AddrFromSlice(e.IP); ok && e.IP != nil {
			x.IP = k.norm(ip)
		}
		if e.Port != nil {
			x.Port = *e.Port
			if e.Protocol != nil {
				x.Proto = *e.Protocol
			}
		}
		if ip, ok := netip.AddrFromSlice(e.IP2); ok && e.IP2 != nil {
			x.IP2 = k.norm(ip)
			if e.CIDR2 != 0 && int(e.CIDR2) != x.IP2.BitLen() {
				x.CIDR2 = e.CIDR2
			}
		}
		out = append(out, x)
	}
	return out, true, nil
}

func (k *Kernel) norm(a netip.Addr) netip.Addr {
	a = a.Unmap()
	if k.f.BitLen == 128 && a.Is4() {
		return netip.AddrFrom16(a.As16())
	}
	return a
}

func (k *Kernel) nlEntry(e Entry) *netlink.IPSetEntry {
	out := &netlink.IPSetEntry{}
	if e.IP.IsValid() {
		out.IP = net.IP(e.IP.AsSlice())
	}
	if e.Port != 0 || e.Proto != 0 {
		port, proto := e.Port, e.Proto
		out.Port, out.Protocol = &port, &proto
		if proto == 0 {
			tcp := uint8(unix.IPPROTO_TCP)
			out.Protocol = &tcp
		}
	}
	if e.IP2.IsValid() {
		out.IP2 = net.IP(e.IP2.AsSlice())
		out.CIDR2 = e.CIDR2
	}
	return out
}

// AddEntry adds e to the ipset (an existing member is not an error).
func (k *Kernel) AddEntry(set string, e Entry) error {
	x := k.nlEntry(e)
	x.Replace = true
	if err := k.nl.IpsetAdd(set, x); err != nil {
		return fmt.Errorf("ipset %s: adding %+v: %w", set, e, err)
	}
	return nil
}

// DelEntry removes e from the ipset (a missing member is not an error).
func (k *Kernel) DelEntry(set string, e Entry) error {
	x := k.nlEntry(e)
	x.Replace = true
	if err := k.nl.IpsetDel(set, x); err != nil && !errors.Is(err, nl.IPSetError(nl.IPSET_ERR_EXIST)) {
		return fmt.Errorf("ipset %s: deleting %+v: %w", set, e, err)
	}
	return nil
}

// SetSysctl writes value to /proc/sys/<name> (slashes) in the caller's
// namespace; IPVS's own settings live under net/ipv4/vs for both families.
func SetSysctl(name, value string) error {
	p := filepath.Join("/proc/sys", name)
	if cur, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(cur)) == value {
		return nil
	}
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", name, value, err)
	}
	return nil
}

// dumpAttempts bounds how often RetryDump reads a table again that the kernel
// said changed while it was read.
const dumpAttempts = 5

// RetryDump runs a netlink dump again while the kernel answers it with
// NLM_F_DUMP_INTR (netlink.ErrDumpInterrupted): the table changed under the
// read, so the answer may have missed or doubled entries. An address appearing
// anywhere on the host (an IPv6 link-local one after a link comes up, say) is
// enough. After dumpAttempts interrupted reads it returns the last answer with
// the error.
func RetryDump[T any](dump func() (T, error)) (T, error) {
	var (
		v   T
		err error
	)
	for range dumpAttempts {
		if v, err = dump(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	return v, err
}

// HostAddrs lists the addresses of the host's interfaces but the dummy links'
// (dsproxy's and kube-proxy's), for NodePorts and the node's own addresses
// (nodeport.AddrLister): Service addresses are neither. It is one address dump,
// as the proxier lists them every sync.
type HostAddrs struct{}

// InterfaceAddrs implements nodeport.AddrLister.
func (HostAddrs) InterfaceAddrs() ([]netip.Addr, error) {
	skip := map[int]bool{}
	for _, name := range []string{LinkName, KubeProxyLinkName} {
		if l, err := netlink.LinkByName(name); err == nil {
			skip[l.Attrs().Index] = true
		}
	}
	as, err := RetryDump(func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_ALL) })
	if err != nil {
		return nil, fmt.Errorf("listing the host's addresses: %w", err)
	}
	out := make([]netip.Addr, 0, len(as))
	for _, a := range as {
		if skip[a.LinkIndex] {
			continue
		}
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}
