package proxier

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/conntrack"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/nodeport"
)

func proxierSizes(p *Proxier) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return fmt.Sprintf("svcMap=%d epMap=%d ports=%d prev=%d triggers=%d unflushed=%d svcPending=%d slicePending=%d",
		len(p.svcMap), len(p.epMap), len(p.state.Ports), len(p.state.Previous), len(p.triggers), len(p.unflushed),
		p.services.Pending(), p.slices.Pending())
}

// TestLeakChurnProxier: rounds of Services and slices added, changed (some
// syncs failing) and deleted leave the proxier's maps, trigger times and
// pending counts as they were.
func TestLeakChurnProxier(t *testing.T) {
	ctx := context.Background()
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			reg := nodeport.New(klog.Background())
			p, b := newTestProxier(t, f, reg)
			if err := p.Sync(ctx, false); err != nil {
				t.Fatal(err)
			}
			p.Sync(ctx, false)
			base := proxierSizes(p)
			now := time.Now()
			for round := 0; round < 4; round++ {
				for i := 0; i < 30; i++ {
					name := fmt.Sprintf("s%d-%d", round, i)
					svc := service(f, name, f)
					svc.Spec.Ports[0].Protocol = []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP}[i%2]
					svc.Spec.Ports[0].NodePort = int32(30000 + i)
					reg.Update(svc)
					p.OnServiceAdd(svc)
					es := endpointSlice(f, name, 1+i%5, 2+i%5)
					es.Endpoints[0].NodeName = ptrTo("node-a")
					es.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: now.Add(time.Duration(i) * time.Second).Format(time.RFC3339Nano)}
					p.OnEndpointSliceAdd(ingest(es))
				}
				if round%2 == 1 {
					b.fail = errors.New("boom")
					_ = p.Sync(ctx, false)
					b.fail = nil
				}
				if err := p.Sync(ctx, round%2 == 1); err != nil {
					t.Fatal(err)
				}
				for i := 0; i < 30; i++ {
					name := fmt.Sprintf("s%d-%d", round, i)
					es := endpointSlice(f, name, 3)
					es.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: now.Format(time.RFC3339Nano)}
					p.OnEndpointSliceUpdate(nil, ingest(es))
				}
				b.fail = errors.New("boom")
				_ = p.Sync(ctx, false)
				b.fail = nil
				for i := 0; i < 30; i++ {
					name := fmt.Sprintf("s%d-%d", round, i)
					svc := service(f, name, f)
					reg.Delete(svc)
					p.OnServiceDelete(svc)
					p.OnEndpointSliceDelete(ingest(endpointSlice(f, name, 3)))
				}
				if err := p.Sync(ctx, false); err != nil {
					t.Fatal(err)
				}
				p.Sync(ctx, false)
				if got := proxierSizes(p); got != base {
					t.Errorf("round %d: %s, baseline %s", round, got, base)
				}
			}
		})
	}
}

func ptrTo[T any](v T) *T { return &v }

// TestLeakUnflushedWhileSyncsFail: while a family's syncs keep failing (a broken
// iptables-restore, a kernel refusing the ruleset), p.unflushed, the ports kept
// for stale-flow cleanup, does not grow with UDP Services created and deleted
// meanwhile: a port that did not exist before the failures and is gone now has
// no flows to clear.
func TestLeakUnflushedWhileSyncsFail(t *testing.T) {
	ctx := context.Background()
	f := family.IPv4
	p, b := newTestProxier(t, f, nil)
	p.cfg.Conntrack = conntrack.NewFake()
	if err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	b.fail = errors.New("iptables-restore: exit status 4")
	sizes := []int{}
	for round := range 4 {
		for i := range 25 {
			svc := service(f, fmt.Sprintf("s%d-%d", round, i), f)
			svc.Spec.Ports[0].Protocol = v1.ProtocolUDP
			p.OnServiceAdd(svc)
			p.OnEndpointSliceAdd(ingest(endpointSlice(f, svc.Name, 1)))
		}
		_ = p.Sync(ctx, true)
		for i := range 25 {
			svc := service(f, fmt.Sprintf("s%d-%d", round, i), f)
			p.OnServiceDelete(svc)
			p.OnEndpointSliceDelete(ingest(endpointSlice(f, svc.Name, 1)))
		}
		_ = p.Sync(ctx, true)
		sizes = append(sizes, len(p.unflushed))
	}
	if sizes[len(sizes)-1] > sizes[0] {
		t.Errorf("p.unflushed after each round of 25 UDP Services created and deleted while syncs fail: %v (no live port)", sizes)
	}
}
