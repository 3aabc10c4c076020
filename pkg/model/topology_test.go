package model

import (
	"fmt"
	"strings"
	"testing"

	"github.com/dsproxy/dsproxy/internal/testaddr"
	"github.com/dsproxy/dsproxy/pkg/family"
)

// ep is a compact endpoint description for tables: "n" is pod address n, flags are
// R(eady) S(erving) T(erminating) L(ocal); zones and nodes are hints.
type ep struct {
	n     int
	flags string
	zones []string
	nodes []string
}

func (e ep) build(f *family.Family) Endpoint {
	out := Endpoint{
		Addr: testaddr.Pod(f, e.n), Port: 8080,
		Ready: strings.Contains(e.flags, "R"), Serving: strings.Contains(e.flags, "S"),
		Terminating: strings.Contains(e.flags, "T"), Local: strings.Contains(e.flags, "L"),
	}
	if len(e.zones)+len(e.nodes) > 0 {
		out.Hints = &Hints{Zones: e.zones, Nodes: e.nodes}
	}
	return out
}

func ids(f *family.Family, eps []Endpoint) string {
	if eps == nil {
		return "-"
	}
	var s []string
	for _, e := range eps {
		for n := 0; n < 64; n++ {
			if testaddr.Pod(f, n) == e.Addr {
				s = append(s, fmt.Sprint(n))
			}
		}
	}
	return strings.Join(s, ",")
}

func TestCategorize(t *testing.T) {
	node := NodeInfo{Name: "node-a", Zone: "zone-a"}
	cases := []struct {
		name           string
		sp             ServicePort
		eps            []ep
		cluster, local string
		hasAny         bool
	}{
		{name: "no endpoints", cluster: "-", local: "-"},
		{name: "ready endpoints all cluster", eps: []ep{{1, "RS", nil, nil}, {2, "RS", nil, nil}, {3, "S", nil, nil}},
			cluster: "1,2", local: "-", hasAny: true},
		{name: "terminating fallback when none ready",
			eps:     []ep{{1, "ST", nil, nil}, {2, "T", nil, nil}, {3, "S", nil, nil}},
			cluster: "1", local: "-", hasAny: true},
		{name: "no ready and no serving-terminating: nothing", eps: []ep{{1, "T", nil, nil}, {2, "", nil, nil}},
			cluster: "-", local: "-", hasAny: false},
		{name: "zone hints honoured", eps: []ep{{1, "RS", []string{"zone-a"}, nil}, {2, "RS", []string{"zone-b"}, nil}},
			cluster: "1", local: "-", hasAny: true},
		{name: "zone hints ignored when one ready endpoint lacks them",
			eps:     []ep{{1, "RS", []string{"zone-a"}, nil}, {2, "RS", nil, nil}},
			cluster: "1,2", local: "-", hasAny: true},
		{name: "zone hints ignored when none is for this zone",
			eps:     []ep{{1, "RS", []string{"zone-b"}, nil}, {2, "RS", []string{"zone-c"}, nil}},
			cluster: "1,2", local: "-", hasAny: true},
		{name: "hints on non-ready endpoints do not matter",
			eps:     []ep{{1, "RS", []string{"zone-a"}, nil}, {2, "", nil, nil}, {3, "RS", []string{"zone-b"}, nil}},
			cluster: "1", local: "-", hasAny: true},
		{name: "node hints win over zone hints",
			eps:     []ep{{1, "RS", []string{"zone-a"}, []string{"node-b"}}, {2, "RS", []string{"zone-a"}, []string{"node-a"}}},
			cluster: "2", local: "-", hasAny: true},
		{name: "node hints for other nodes fall back to zone",
			eps:     []ep{{1, "RS", []string{"zone-a"}, []string{"node-b"}}, {2, "RS", []string{"zone-b"}, []string{"node-c"}}},
			cluster: "1", local: "-", hasAny: true},
		{name: "internalTrafficPolicy Local: only local endpoints, no cluster",
			sp:  ServicePort{InternalPolicyLocal: true},
			eps: []ep{{1, "RS", nil, nil}, {2, "RSL", nil, nil}}, cluster: "-", local: "2", hasAny: true},
		{name: "internalTrafficPolicy Local without local endpoints still knows others exist",
			sp:  ServicePort{InternalPolicyLocal: true},
			eps: []ep{{1, "RS", nil, nil}}, cluster: "-", local: "-", hasAny: true},
		{name: "externalTrafficPolicy Local: cluster and local",
			sp:  ServicePort{ExternalPolicyLocal: true, NodePort: 30000},
			eps: []ep{{1, "RS", nil, nil}, {2, "RSL", nil, nil}, {3, "STL", nil, nil}}, cluster: "1,2", local: "2", hasAny: true},
		{name: "local falls back to local serving-terminating",
			sp:  ServicePort{ExternalPolicyLocal: true, NodePort: 30000},
			eps: []ep{{1, "RS", nil, nil}, {2, "STL", nil, nil}, {3, "SL", nil, nil}}, cluster: "1", local: "2", hasAny: true},
		{name: "externalTrafficPolicy Local without external access uses cluster only",
			sp:  ServicePort{ExternalPolicyLocal: true},
			eps: []ep{{1, "RS", nil, nil}, {2, "RSL", nil, nil}}, cluster: "1,2", local: "-", hasAny: true},
	}
	for _, f := range family.All {
		for _, tc := range cases {
			t.Run(f.Name+"/"+tc.name, func(t *testing.T) {
				var eps []Endpoint
				for _, e := range tc.eps {
					eps = append(eps, e.build(f))
				}
				sp := tc.sp
				sel := Categorize(&sp, eps, node)
				if got := ids(f, sel.Cluster); got != tc.cluster {
					t.Errorf("cluster = %s, want %s", got, tc.cluster)
				}
				if got := ids(f, sel.Local); got != tc.local {
					t.Errorf("local = %s, want %s", got, tc.local)
				}
				if sel.HasAny != tc.hasAny {
					t.Errorf("hasAny = %v, want %v", sel.HasAny, tc.hasAny)
				}
			})
		}
	}
}

func TestFilterSharesWhenAllKept(t *testing.T) {
	eps := []Endpoint{{Port: 1, Ready: true}, {Port: 2, Ready: true}}
	out := filter(eps, func(e *Endpoint) bool { return e.Ready })
	if &out[0] != &eps[0] {
		t.Fatal("filter copied a list it kept whole")
	}
	out = filter(eps, func(e *Endpoint) bool { return e.Port == 2 })
	if len(out) != 1 || out[0].Port != 2 || &out[0] == &eps[1] {
		t.Fatalf("filter result %v", out)
	}
}

// A node without a zone label is in zone "", as in kube-proxy: hints for zone ""
// (only a third-party controller writes those) select it; others are ignored.
func TestCategorizeNodeWithoutZone(t *testing.T) {
	f := family.IPv4
	node := NodeInfo{Name: "node-a"}
	for _, tc := range []struct {
		eps     []ep
		cluster string
	}{
		{[]ep{{1, "RS", []string{""}, nil}, {2, "RS", []string{"zone-b"}, nil}}, "1"},
		{[]ep{{1, "RS", []string{"zone-a"}, nil}, {2, "RS", []string{"zone-b"}, nil}}, "1,2"},
	} {
		var eps []Endpoint
		for _, e := range tc.eps {
			eps = append(eps, e.build(f))
		}
		if got := ids(f, Categorize(&ServicePort{}, eps, node).Cluster); got != tc.cluster {
			t.Errorf("%v: cluster = %s, want %s", tc.eps, got, tc.cluster)
		}
	}
}
