//go:build netns

package netns

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// Addressing plan. Every namespace has one IPv4 and one IPv6 address, configured as
// a /32 and /128 on each of its links (the "routed" model of Calico-like CNIs):
// peers reach each other through explicit on-link host routes, so there is no
// shared subnet, no bridge and no proxy ARP.
var (
	// NodeIPv4 and NodeIPv6 are the node's address (the Kubernetes node IP). The node
	// uses it on every link, so traffic the node originates or masquerades towards a
	// pod, the external client or the remote node carries this source address.
	NodeIPv4 = netip.MustParseAddr("192.0.2.1")
	NodeIPv6 = netip.MustParseAddr("2001:db8:2::1")
	// RemoteNodeIPv4 and RemoteNodeIPv6 are the remote node's address.
	RemoteNodeIPv4 = netip.MustParseAddr("192.0.2.2")
	RemoteNodeIPv6 = netip.MustParseAddr("2001:db8:2::2")
	// ExternalIPv4 and ExternalIPv6 are the external client's address. The node
	// routes the whole ExternalCIDRs to the external link.
	ExternalIPv4 = netip.MustParseAddr("198.51.100.1")
	ExternalIPv6 = netip.MustParseAddr("2001:db8:c::1")
	// ExternalCIDRs are routed by the node to the external namespace.
	ExternalCIDRs = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8:c::/64")}
	// LocalPodCIDRs hold the addresses of pods on the node: the n-th pod added with
	// AddPod gets 10.64.0.n and fd00:64::n (n from 1).
	LocalPodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.64.0.0/24"), netip.MustParsePrefix("fd00:64::/64")}
	// RemotePodCIDRs hold the addresses of pods on the remote node (10.64.1.n,
	// fd00:64:1::n); the node routes them via the remote node's address.
	RemotePodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.64.1.0/24"), netip.MustParsePrefix("fd00:64:1::/64")}
)

// Cluster is a set of network namespaces: Node, External and the pods. Create it with
// New; it is removed by Close, which New registers with t.Cleanup. Building methods
// (AddPod, AddRemotePod, NS.Serve) report errors with tb.Fatal and must be called
// from the test goroutine; Dial, RunIn and Exec may be called from any goroutine.
type Cluster struct {
	// Node plays the Kubernetes node where the proxy runs: IP forwarding is on, and
	// it routes to every pod, to the external client and to the remote node.
	Node *NS
	// External is an outside client connected to the node by a veth pair; its
	// default route points at the node, so it can reach node IPs, pod IPs and any
	// service VIP the proxy programs on the node.
	External *NS
	// RemoteNode is nil until the first AddRemotePod: a second node, connected to
	// Node by a veth pair, whose pods are reached through it.
	RemoteNode *NS

	tb     testing.TB
	prefix string

	mu        sync.Mutex
	all       []*NS // creation order
	pods      map[string]*NS
	localN    int
	remoteN   int
	closeOnce sync.Once
	closeErr  error
}

// NS is one network namespace of the cluster.
type NS struct {
	// Name is the logical name: "node", "external", "remote-node" or the pod name.
	// Servers in the namespace answer with it.
	Name string
	// NetnsName is the name under /run/netns, usable with `ip netns exec`/`ip -n`.
	NetnsName string
	// IPv4 and IPv6 are the namespace's addresses.
	IPv4, IPv6 netip.Addr
	// Remote reports a pod on the remote node.
	Remote bool

	c      *Cluster
	handle vnetns.NsHandle
	nlh    *netlink.Handle
	links  int // veth links towards children, for interface naming

	srvMu   sync.Mutex
	closers []func() error
	srvWG   sync.WaitGroup
}

var clusterSeq atomic.Uint32

var podNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$`)

// New builds a cluster with a Node and an External namespace. It skips the test when
// not running as root. Errors are fatal to tb; Close is registered with tb.Cleanup.
func New(tb testing.TB) *Cluster {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("netns harness needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN to create network namespaces)")
	}
	c := &Cluster{
		tb:     tb,
		prefix: fmt.Sprintf("dsp%d-%d", os.Getpid(), clusterSeq.Add(1)),
		pods:   map[string]*NS{},
	}
	tb.Cleanup(func() {
		if err := c.Close(); err != nil {
			tb.Errorf("netns cluster cleanup: %v", err)
		}
	})
	var err error
	if c.Node, err = c.newNS("node", NodeIPv4, NodeIPv6, true); err != nil {
		tb.Fatalf("netns: node: %v", err)
	}
	if c.External, err = c.newNS("external", ExternalIPv4, ExternalIPv6, false); err != nil {
		tb.Fatalf("netns: external: %v", err)
	}
	if err := c.link(c.Node, c.External, "ext0", ExternalCIDRs); err != nil {
		tb.Fatalf("netns: external link: %v", err)
	}
	return c
}

// Prefix is the common prefix of the cluster's names under /run/netns.
func (c *Cluster) Prefix() string { return c.prefix }

// Namespaces returns every namespace of the cluster in creation order.
func (c *Cluster) Namespaces() []*NS {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*NS(nil), c.all...)
}

// Pod returns the pod with that name, or nil.
func (c *Cluster) Pod(name string) *NS {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pods[name]
}

// AddPod adds a pod on the node: a namespace with addresses 10.64.0.n and
// fd00:64::n, connected to the node by a veth pair (eth0 in the pod), with /32 and
// /128 routes to it on the node and a default route via the node. Errors are fatal.
func (c *Cluster) AddPod(name string) *NS {
	c.tb.Helper()
	p, err := c.addPod(name, false)
	if err != nil {
		c.tb.Fatalf("netns: add pod %q: %v", name, err)
	}
	return p
}

// AddRemotePod adds a pod on the remote node (10.64.1.n, fd00:64:1::n), creating the
// remote node on first use. The node reaches it through the remote node, so traffic
// the proxy sends to it leaves the node like traffic to an endpoint on another node.
func (c *Cluster) AddRemotePod(name string) *NS {
	c.tb.Helper()
	p, err := c.addPod(name, true)
	if err != nil {
		c.tb.Fatalf("netns: add remote pod %q: %v", name, err)
	}
	return p
}

func (c *Cluster) addPod(name string, remote bool) (*NS, error) {
	if !podNameRE.MatchString(name) || name == "node" || name == "external" || name == "remote-node" {
		return nil, fmt.Errorf("invalid pod name (want a short DNS label, not a reserved name)")
	}
	c.mu.Lock()
	_, dup := c.pods[name]
	n := 0
	if remote {
		c.remoteN++
		n = c.remoteN
	} else {
		c.localN++
		n = c.localN
	}
	c.mu.Unlock()
	if dup {
		return nil, fmt.Errorf("duplicate pod name")
	}
	if n > 250 {
		return nil, fmt.Errorf("too many pods")
	}
	cidrs := LocalPodCIDRs
	parent := c.Node
	if remote {
		cidrs = RemotePodCIDRs
		if c.RemoteNode == nil {
			if err := c.addRemoteNode(); err != nil {
				return nil, fmt.Errorf("remote node: %w", err)
			}
		}
		parent = c.RemoteNode
	}
	v4 := nthAddr(cidrs[0], n)
	v6 := nthAddr(cidrs[1], n)
	p, err := c.newNS(name, v4, v6, false)
	if err != nil {
		return nil, err
	}
	p.Remote = remote
	c.mu.Lock()
	c.pods[name] = p
	c.mu.Unlock()
	if err := c.link(parent, p, "", nil); err != nil {
		return nil, err
	}
	return p, nil
}

func (c *Cluster) addRemoteNode() error {
	rn, err := c.newNS("remote-node", RemoteNodeIPv4, RemoteNodeIPv6, true)
	if err != nil {
		return err
	}
	c.RemoteNode = rn
	if err := c.link(c.Node, rn, "rn0", nil); err != nil {
		return err
	}
	for i, cidr := range RemotePodCIDRs {
		gw := []netip.Addr{RemoteNodeIPv4, RemoteNodeIPv6}[i]
		r := &netlink.Route{
			LinkIndex: 0,
			Dst:       prefixToIPNet(cidr),
			Gw:        net.IP(gw.AsSlice()),
		}
		if err := c.Node.nlh.RouteAdd(r); err != nil {
			return fmt.Errorf("node route %s via %s: %w", cidr, gw, err)
		}
	}
	return nil
}

// nthAddr returns the n-th address of p (p's address plus n).
func nthAddr(p netip.Prefix, n int) netip.Addr {
	b := p.Addr().AsSlice()
	b[len(b)-1] += byte(n)
	a, _ := netip.AddrFromSlice(b)
	return a
}

// newNS creates a named network namespace with sysctls for the harness and lo up.
func (c *Cluster) newNS(name string, v4, v6 netip.Addr, router bool) (*NS, error) {
	full := c.prefix + "-" + name
	var h vnetns.NsHandle
	err := onFreshThread(func() error {
		var err error
		h, err = vnetns.NewNamed(full)
		if err != nil {
			// NewNamed may leave the mount point file behind on a failed mount.
			_ = os.Remove(filepath.Join(netnsDir, full))
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create netns %s: %w", full, err)
	}
	n := &NS{Name: name, NetnsName: full, IPv4: v4, IPv6: v6, c: c, handle: h}
	c.mu.Lock()
	c.all = append(c.all, n) // from here on Close removes it
	c.mu.Unlock()
	if n.nlh, err = netlink.NewHandleAt(h); err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", full, err)
	}
	sysctls := []struct{ key, val string }{
		// IPv6 addresses usable at once: no duplicate address detection.
		{"net/ipv6/conf/all/accept_dad", "0"},
		{"net/ipv6/conf/default/accept_dad", "0"},
		// New namespaces copy IPv4 devconf (rp_filter, forwarding...) from the host;
		// make the harness independent of the host's settings.
		{"net/ipv4/conf/all/rp_filter", "0"},
		{"net/ipv4/conf/default/rp_filter", "0"},
		// Refused-port tests send many ICMP errors to the same peer quickly.
		{"net/ipv4/icmp_ratelimit", "0"},
		{"net/ipv6/icmp/ratelimit", "0"},
	}
	fwd := "0"
	if router {
		fwd = "1"
	}
	sysctls = append(sysctls,
		struct{ key, val string }{"net/ipv4/ip_forward", fwd},
		struct{ key, val string }{"net/ipv6/conf/all/forwarding", fwd},
	)
	err = RunIn(n, func() error {
		for _, s := range sysctls {
			if err := os.WriteFile("/proc/sys/"+s.key, []byte(s.val), 0); err != nil {
				return fmt.Errorf("sysctl %s: %w", s.key, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	lo, err := n.nlh.LinkByName("lo")
	if err != nil {
		return nil, err
	}
	if err := n.nlh.LinkSetUp(lo); err != nil {
		return nil, err
	}
	return n, nil
}

// link connects child to parent with a veth pair (parentIf in parent, eth0 in
// child). Each end carries its namespace's addresses as /32 and /128; parent routes
// the child's addresses and extra to the link, the child routes the parent's
// addresses on-link and uses them as default gateways.
func (c *Cluster) link(parent, child *NS, parentIf string, extra []netip.Prefix) error {
	if parentIf == "" {
		parentIf = fmt.Sprintf("vp%d", parent.links)
		parent.links++
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: parentIf},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(child.handle)),
	}
	if err := parent.nlh.LinkAdd(veth); err != nil {
		return fmt.Errorf("veth %s/%s: %w", parent.Name, parentIf, err)
	}
	pl, err := parent.nlh.LinkByName(parentIf)
	if err != nil {
		return err
	}
	cl, err := child.nlh.LinkByName("eth0")
	if err != nil {
		return err
	}
	for _, end := range []struct {
		ns   *NS
		link netlink.Link
	}{{parent, pl}, {child, cl}} {
		for _, a := range []netip.Addr{end.ns.IPv4, end.ns.IPv6} {
			addr := &netlink.Addr{IPNet: prefixToIPNet(netip.PrefixFrom(a, a.BitLen())), Flags: unix.IFA_F_NODAD}
			if err := end.ns.nlh.AddrAdd(end.link, addr); err != nil {
				return fmt.Errorf("%s: addr %s: %w", end.ns.Name, a, err)
			}
		}
		if err := end.ns.nlh.LinkSetUp(end.link); err != nil {
			return fmt.Errorf("%s: link up: %w", end.ns.Name, err)
		}
	}
	// Carrier comes up asynchronously (linkwatch); packets sent before both ends are
	// operationally up are dropped, and a lost TCP SYN costs a 1s retransmit.
	for _, end := range []struct {
		ns   *NS
		name string
	}{{parent, parentIf}, {child, "eth0"}} {
		if err := waitOperUp(end.ns, end.name); err != nil {
			return err
		}
	}
	dsts := []netip.Prefix{
		netip.PrefixFrom(child.IPv4, 32), netip.PrefixFrom(child.IPv6, 128),
	}
	for _, d := range append(dsts, extra...) {
		r := &netlink.Route{LinkIndex: pl.Attrs().Index, Dst: prefixToIPNet(d), Scope: netlink.SCOPE_LINK}
		if err := parent.nlh.RouteAdd(r); err != nil {
			return fmt.Errorf("%s: route %s dev %s: %w", parent.Name, d, parentIf, err)
		}
	}
	for _, gw := range []netip.Addr{parent.IPv4, parent.IPv6} {
		r := &netlink.Route{LinkIndex: cl.Attrs().Index, Dst: prefixToIPNet(netip.PrefixFrom(gw, gw.BitLen())), Scope: netlink.SCOPE_LINK}
		if err := child.nlh.RouteAdd(r); err != nil {
			return fmt.Errorf("%s: route %s dev eth0: %w", child.Name, gw, err)
		}
		def := &netlink.Route{LinkIndex: cl.Attrs().Index, Dst: prefixToIPNet(family.Of(gw).AnyPrefix), Gw: net.IP(gw.AsSlice())}
		if err := child.nlh.RouteAdd(def); err != nil {
			return fmt.Errorf("%s: default via %s: %w", child.Name, gw, err)
		}
	}
	return nil
}

func waitOperUp(n *NS, name string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		l, err := n.nlh.LinkByName(name)
		if err != nil {
			return err
		}
		if l.Attrs().OperState == netlink.OperUp {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %s not operationally up after 5s (state %s)", n.Name, name, l.Attrs().OperState)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// IP returns the namespace's address of the family.
func (n *NS) IP(f *family.Family) netip.Addr {
	if f == family.IPv6 {
		return n.IPv6
	}
	return n.IPv4
}

// Handle returns the namespace's handle (owned by the cluster; do not close it),
// e.g. for netlink.NewHandleAt or APIs taking a namespace.
func (n *NS) Handle() vnetns.NsHandle { return n.handle }

// Netlink returns a netlink handle whose sockets live in the namespace (owned by
// the cluster; do not close it).
func (n *NS) Netlink() *netlink.Handle { return n.nlh }

// Path returns the namespace's bind mount under /run/netns.
func (n *NS) Path() string { return filepath.Join(netnsDir, n.NetnsName) }

func (n *NS) String() string { return n.Name }

const netnsDir = "/run/netns"

// Close stops every server, closes every handle and deletes every namespace of the
// cluster. It is idempotent and safe to call from t.Cleanup.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		all := append([]*NS(nil), c.all...)
		c.mu.Unlock()
		var errs []error
		for i := len(all) - 1; i >= 0; i-- {
			n := all[i]
			errs = append(errs, n.stopServers())
			if n.nlh != nil {
				n.nlh.Close()
			}
			if n.handle.IsOpen() {
				errs = append(errs, n.handle.Close())
			}
			if err := vnetns.DeleteNamed(n.NetnsName); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.EINVAL) {
				errs = append(errs, fmt.Errorf("delete netns %s: %w", n.NetnsName, err))
			}
			// Belt and braces: the file must not survive a failed unmount either.
			if err := os.Remove(n.Path()); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}
