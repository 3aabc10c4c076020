package proxier

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"

	"github.com/dsproxy/dsproxy/internal/testaddr"
	"github.com/dsproxy/dsproxy/pkg/conntrack"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
)

func portState(f *family.Family, proto v1.Protocol, nodePort uint16, pods ...int) *model.PortState {
	ps := &model.PortState{ServicePort: &model.ServicePort{ClusterIP: testaddr.Svc(f, 10), Port: 53, Protocol: proto, NodePort: nodePort}}
	for _, n := range pods {
		ps.Cluster = append(ps.Cluster, model.Endpoint{Addr: testaddr.Pod(f, n), Port: 5353, Ready: true})
	}
	return ps
}

func TestStaleFlows(t *testing.T) {
	type flow struct {
		dst   func(f *family.Family) netip.AddrPort
		reply int // pod number the flow was DNATed to; 0: not DNATed (rejected)
	}
	cluster := func(f *family.Family) netip.AddrPort { return netip.AddrPortFrom(testaddr.Svc(f, 10), 53) }
	nodePort := func(f *family.Family) netip.AddrPort { return netip.AddrPortFrom(testaddr.Node(f, 1), 30053) }
	lbVIP := func(f *family.Family) netip.AddrPort { return netip.AddrPortFrom(testaddr.Ext(f, 1), 53) }
	cases := []struct {
		name          string
		old, cur      func(f *family.Family) *model.PortState
		cleared, kept []flow
		filters       int
	}{
		{name: "TCP never needs cleanup",
			old: func(f *family.Family) *model.PortState { return portState(f, v1.ProtocolTCP, 0, 1, 2) },
			cur: func(f *family.Family) *model.PortState { return portState(f, v1.ProtocolTCP, 0, 1) }},
		{name: "UDP endpoint added: nothing stale",
			old: func(f *family.Family) *model.PortState { return portState(f, v1.ProtocolUDP, 0, 1) },
			cur: func(f *family.Family) *model.PortState { return portState(f, v1.ProtocolUDP, 0, 1, 2) }},
		{name: "UDP endpoint removed: its flows go, others stay",
			old:     func(f *family.Family) *model.PortState { return portState(f, v1.ProtocolUDP, 30053, 1, 2) },
			cur:     func(f *family.Family) *model.PortState { return portState(f, v1.ProtocolUDP, 30053, 1) },
			cleared: []flow{{cluster, 2}, {nodePort, 2}}, kept: []flow{{cluster, 1}, {nodePort, 1}}, filters: 2},
		{name: "UDP loses its only serving endpoint: its flows stay, as kube-proxy's",
			old:  func(f *family.Family) *model.PortState { return portState(f, v1.ProtocolUDP, 30053, 1) },
			cur:  func(f *family.Family) *model.PortState { return portState(f, v1.ProtocolUDP, 30053) },
			kept: []flow{{cluster, 1}, {nodePort, 1}}},
		{name: "UDP serves again, from another endpoint: flows to the old one go",
			old:     func(f *family.Family) *model.PortState { return portState(f, v1.ProtocolUDP, 30053) },
			cur:     func(f *family.Family) *model.PortState { return portState(f, v1.ProtocolUDP, 30053, 2) },
			cleared: []flow{{cluster, 1}, {nodePort, 1}, {cluster, 0}}, kept: []flow{{cluster, 2}, {nodePort, 2}}, filters: 2},
		{name: "UDP serves again, from the same endpoint: its flows stay",
			old:     func(f *family.Family) *model.PortState { return portState(f, v1.ProtocolUDP, 30053) },
			cur:     func(f *family.Family) *model.PortState { return portState(f, v1.ProtocolUDP, 30053, 1) },
			cleared: []flow{{cluster, 0}}, kept: []flow{{cluster, 1}, {nodePort, 1}}, filters: 2},
		{name: "UDP gains its first endpoint: rejected flows go",
			old:     func(f *family.Family) *model.PortState { return portState(f, v1.ProtocolUDP, 0) },
			cur:     func(f *family.Family) *model.PortState { return portState(f, v1.ProtocolUDP, 0, 1) },
			cleared: []flow{{cluster, 0}}, filters: 1},
		{name: "new UDP service with endpoints clears earlier rejected flows",
			cur:     func(f *family.Family) *model.PortState { return portState(f, v1.ProtocolUDP, 0, 1) },
			cleared: []flow{{cluster, 0}}, filters: 1},
		{name: "UDP load-balancer VIP added to a serving port: flows that went un-NATed to it go",
			old: func(f *family.Family) *model.PortState { return portState(f, v1.ProtocolUDP, 0, 1) },
			cur: func(f *family.Family) *model.PortState {
				ps := portState(f, v1.ProtocolUDP, 0, 1)
				ps.LoadBalancerVIPs = []netip.Addr{testaddr.Ext(f, 1)}
				return ps
			},
			cleared: []flow{{lbVIP, 0}}, kept: []flow{{lbVIP, 1}, {cluster, 0}, {cluster, 1}}, filters: 1},
		{name: "UDP NodePort added to a serving port: flows that went un-NATed to it go",
			old:     func(f *family.Family) *model.PortState { return portState(f, v1.ProtocolUDP, 0, 1) },
			cur:     func(f *family.Family) *model.PortState { return portState(f, v1.ProtocolUDP, 30053, 1) },
			cleared: []flow{{nodePort, 0}}, kept: []flow{{nodePort, 1}, {cluster, 0}}, filters: 1},
		{name: "UDP VIP added to a port without endpoints: its flows stay",
			old: func(f *family.Family) *model.PortState { return portState(f, v1.ProtocolUDP, 0) },
			cur: func(f *family.Family) *model.PortState {
				ps := portState(f, v1.ProtocolUDP, 0)
				ps.LoadBalancerVIPs = []netip.Addr{testaddr.Ext(f, 1)}
				return ps
			}},
		{name: "SCTP service deleted: all its flows go",
			old:     func(f *family.Family) *model.PortState { return portState(f, v1.ProtocolSCTP, 30053, 1) },
			cleared: []flow{{cluster, 1}, {nodePort, 1}}, filters: 2},
	}
	for _, f := range family.All {
		for _, tc := range cases {
			t.Run(f.Name+"/"+tc.name, func(t *testing.T) {
				var old, cur *model.PortState
				if tc.old != nil {
					old = tc.old(f)
				}
				if tc.cur != nil {
					cur = tc.cur(f)
				}
				filters := staleFlows(old, cur)
				if len(filters) != tc.filters {
					t.Fatalf("%d filters, want %d: %+v", len(filters), tc.filters, filters)
				}
				matches := func(fl flow) bool {
					dst := fl.dst(f)
					reply := dst
					if fl.reply != 0 {
						reply = netip.AddrPortFrom(testaddr.Pod(f, fl.reply), 5353)
					}
					flw := conntrack.Flow{Protocol: conntrack.UDP, OrigSrc: netip.AddrPortFrom(testaddr.Client(f, 1), 4000), OrigDst: dst, ReplySrc: reply}
					if ps := cur; ps != nil || old != nil {
						if ps == nil {
							ps = old
						}
						flw.Protocol, _ = conntrack.ProtocolFor(ps.Protocol)
					}
					for _, fi := range filters {
						if fi.Match(flw) {
							return true
						}
					}
					return false
				}
				for _, fl := range tc.cleared {
					if !matches(fl) {
						t.Errorf("flow to %s via pod %d not cleared", fl.dst(f), fl.reply)
					}
				}
				for _, fl := range tc.kept {
					if matches(fl) {
						t.Errorf("flow to %s via pod %d cleared", fl.dst(f), fl.reply)
					}
				}
			})
		}
	}
}

func TestSyncClearsStaleFlows(t *testing.T) {
	f := family.IPv4
	p, _ := newTestProxier(t, f, nil)
	es, fake := udpService(t, p, f)
	calls := len(fake.Calls())
	gone := netip.AddrPortFrom(testaddr.Pod(f, 2), 8080) // the flow's endpoint, about to go
	obs := &conntrackObserver{}
	p.cfg.Observer = obs
	es2 := es.DeepCopy()
	es2.Endpoints = es2.Endpoints[:1]
	p.OnEndpointSliceUpdate(ingest(es), ingest(es2))
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if len(fake.Calls()) != calls+1 {
		t.Fatalf("endpoint removal made %d conntrack calls", len(fake.Calls())-calls)
	}
	if len(fake.Flows()) != 0 {
		t.Errorf("flow to the removed endpoint %s kept: %v", gone, fake.Flows())
	}
	if obs.rounds != 1 || obs.deleted != 1 || obs.fam != f {
		t.Errorf("conntrack observer saw %d rounds deleting %d entries (%v), want 1 round deleting 1 (IPv4)", obs.rounds, obs.deleted, obs.fam)
	}
}

type conntrackObserver struct {
	programmingObserver
	rounds, deleted int
	fam             *family.Family
}

func (o *conntrackObserver) ConntrackCleared(f *family.Family, _ time.Duration, deleted int) {
	o.rounds++
	o.deleted += deleted
	o.fam = f
}

// BenchmarkStaleFlows: the filters after one of a UDP Service's 20k endpoints went
// (both lists were walked per endpoint before: 0.44 s here).
func BenchmarkStaleFlows(b *testing.B) {
	mk := func(skip int) *model.PortState {
		ps := &model.PortState{ServicePort: &model.ServicePort{ClusterIP: netip.MustParseAddr("10.96.0.1"), Port: 53, Protocol: v1.ProtocolUDP}}
		for i := range 20000 {
			if i != skip {
				a := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
				ps.Cluster = append(ps.Cluster, model.Endpoint{Addr: a, Port: 53, Ready: true, Serving: true})
			}
		}
		return ps
	}
	old, cur := mk(-1), mk(7)
	for b.Loop() {
		if got := staleFlows(old, cur); len(got) != 1 || len(got[0].Keep) != 19999 {
			b.Fatalf("filters %d", len(got))
		}
	}
}

// udpService sets up a UDP Service "dns" with endpoints on pods 1 and 2, synced,
// and a flow DNATed to pod 2; it returns the slice and the conntrack fake.
func udpService(t *testing.T, p *Proxier, f *family.Family) (*discovery.EndpointSlice, *conntrack.Fake) {
	t.Helper()
	fake := conntrack.NewFake()
	p.cfg.Conntrack = fake
	svc := service(f, "dns", f)
	svc.Spec.Ports[0].Protocol = v1.ProtocolUDP
	es := endpointSlice(f, "dns", 1, 2)
	es.Ports[0].Protocol = &svc.Spec.Ports[0].Protocol
	p.OnServiceAdd(svc)
	p.OnEndpointSliceAdd(ingest(es))
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	client := netip.AddrPortFrom(testaddr.Pod(f, 9), 5353)
	fake.Add(conntrack.Flow{Protocol: conntrack.UDP, OrigSrc: client, OrigDst: netip.AddrPortFrom(testaddr.Svc(f, 10), 80),
		ReplySrc: netip.AddrPortFrom(testaddr.Pod(f, 2), 8080), ReplyDst: client})
	return es, fake
}

// An endpoint removed by a sync that failed: the retry (a full sync that finds
// nothing changed) still clears its flows.
func TestFailedSyncStillClearsStaleFlows(t *testing.T) {
	f := family.IPv4
	p, b := newTestProxier(t, f, nil)
	es, fake := udpService(t, p, f)
	es2 := es.DeepCopy()
	es2.Endpoints = es2.Endpoints[:1]
	p.OnEndpointSliceUpdate(ingest(es), ingest(es2))
	b.fail = errors.New("iptables-restore: exit status 1")
	if err := p.Sync(context.Background(), false); err == nil {
		t.Fatal("sync did not fail")
	}
	b.fail = nil
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	if len(fake.Flows()) != 0 {
		t.Errorf("the flow to the endpoint removed by the failed sync kept after the retry: %v", fake.Flows())
	}
	// A UDP Service added by a failed sync and deleted before the retry.
	tmp := service(f, "tmp", f)
	tmp.Spec.Ports[0].Protocol = v1.ProtocolUDP
	p.OnServiceAdd(tmp)
	b.fail = errors.New("iptables-restore: exit status 1")
	if err := p.Sync(context.Background(), false); err == nil {
		t.Fatal("sync did not fail")
	}
	b.fail = nil
	p.OnServiceDelete(tmp)
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatal(err)
	}
}

// A UDP endpoint that terminates but still serves keeps its flows until it stops
// serving, as in kube-proxy (the cleanup ignores traffic policies, topology and
// terminating state); new flows go to the ready ones.
func TestTerminatingServingKeepsFlows(t *testing.T) {
	f := family.IPv6
	p, _ := newTestProxier(t, f, nil)
	es, fake := udpService(t, p, f)
	term := es.DeepCopy()
	term.Endpoints[1].Conditions = discovery.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
	p.OnEndpointSliceUpdate(ingest(es), ingest(term))
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if len(fake.Flows()) != 1 {
		t.Fatalf("the flow to the terminating, serving endpoint cleared")
	}
	gone := term.DeepCopy()
	gone.Endpoints[1].Conditions.Serving = ptr.To(false)
	p.OnEndpointSliceUpdate(ingest(term), ingest(gone))
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if len(fake.Flows()) != 0 {
		t.Errorf("the flow to the endpoint that stopped serving kept: %v", fake.Flows())
	}
}
