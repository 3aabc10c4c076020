// Package nftables is dsproxy's nftables backend for one address family ("shape B"
// of the nftables spike): service and endpoint churn are only element operations on
// a few global sets and maps. There are no per-service chains; chains and verdict
// map elements exist per endpoint count in use, not per Service.
//
// A ClusterIP is an element of @svc-groups naming the group of its endpoint count
// N; one dispatch rule sends it, through a small verdict map, to the group's chain,
// whose rule DNATs "daddr . l4proto . dport . numgen random mod N" through the
// global @endpoints map. ExternalIPs and LoadBalancer VIPs are elements of
// @ext-groups (and its Local and short-circuit variants) and have their own
// elements in @endpoints; NodePorts are elements of @np-groups with
// @nodeport-endpoints. Adding an endpoint to a 10-endpoint service is, per
// frontend: one endpoint element, and its dispatch element's group changed from
// N=10 to N=11 (a delete and an add). Every rule lists with nft 1.0.6 (see doc.go).
//
// doc.go shows the ruleset; nft.Fake.Dump prints a live one.
package nftables

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/nft"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

// Options tune the backend; the zero value gives the defaults.
type Options struct {
	// MaxElementsPerTx bounds the element operations of one cold-start transaction,
	// so that a big cold start holds the kernel's nftables lock for a bounded time
	// (default 5000: about 500 ClusterIP services of 10 endpoints; each NodePort,
	// ExternalIP or VIP of a service repeats its endpoint elements). The two
	// families' transactions take one lock, the network namespace's: with 5000 a
	// transaction holds it 25–60 ms at 30k Services where 50000 held it 190–330 ms,
	// and the families' builds overlap each other's commits, so the cold start's
	// kernel time fell by 10–25 % and its peak RSS by about 10 MiB at 10k
	// (bench TestKernelFigures, DSPROXY_BENCH_TX_ELEMENTS).
	MaxElementsPerTx int
	// RebuildEvery makes every n-th full sync rebuild the whole table and swap it in
	// (default 12; negative: never). That is how @endpoints, @nodeport-endpoints (too big
	// to read back cheaply) and rule details that print alike are kept honest.
	RebuildEvery int
	// TCPBeLiberal says the node sets net.netfilter.nf_conntrack_tcp_be_liberal:
	// then, as kube-proxy's iptables mode does, packets conntrack marks invalid
	// are not dropped in filter-forward (kube-proxy's nftables mode never drops
	// them; dsproxy keeps the iptables mode's guard against the connection-reset
	// bug of kernels before 6.1 unless the node opted out of it).
	TCPBeLiberal bool
	// MasqueradeMark is the packet mark bit that asks for masquerading: 1 <<
	// the configured masquerade bit (config.Config.MasqueradeBit); 0 means
	// 0x4000, bit 14, kube-proxy's default.
	MasqueradeMark uint32
}

const (
	defaultMaxElementsPerTx = 5000
	defaultRebuildEvery     = 12
)

// Backend programs one family's nftables ruleset. It implements proxier.Backend;
// Sync must not be called concurrently.
type Backend struct {
	f    *family.Family
	k    nft.Kernel
	opts Options
	x    exprs

	table     string // the live table, "" before the first successful sync
	c         *cache // nil until the first successful sync
	dirty     bool   // the kernel may differ from c: rebuild on the next sync
	fullSyncs int
	// flushSeen: Flushed found the live table's base chains changed; the
	// next sync counts it as a repair.
	flushSeen bool
	// affinitySeen is how many entries each affinity map held when last read.
	affinitySeen map[fixedSet]int
}

var _ proxier.Backend = (*Backend)(nil)

// New returns a backend for family f that talks to k. It has no side effects: the
// first Sync builds the ruleset.
func New(f *family.Family, k nft.Kernel, opts Options) *Backend {
	if opts.MaxElementsPerTx <= 0 {
		opts.MaxElementsPerTx = defaultMaxElementsPerTx
	}
	if opts.RebuildEvery == 0 {
		opts.RebuildEvery = defaultRebuildEvery
	}
	x := newExprs(f)
	x.keepInvalid = opts.TCPBeLiberal
	if opts.MasqueradeMark != 0 {
		x.masq = opts.MasqueradeMark
	}
	return &Backend{f: f, k: k, opts: opts, x: x, affinitySeen: map[fixedSet]int{}}
}

// Table returns the name of the live table ("" before the first successful sync).
func (b *Backend) Table() string { return b.table }

var _ proxier.FlushDetector = (*Backend)(nil)

// Flushed implements proxier.FlushDetector: the rules of a base chain of the
// live table are not the ones written, so the periodic check resyncs within
// syncPeriod. That is the table deleted ("nft flush ruleset", as the nftables
// service's restart does, or by hand), emptied ("nft flush table"), or a base
// chain deleted, flushed or edited. kube-proxy's nftables mode repairs these
// only after its next change (whose partial sync fails and is retried in full)
// or at its hourly sync. It costs one netlink dump per base chain (eight, about
// 0.3 ms in all). The other chains and the sets are checked by the full sync
// (verify), as is a base chain's hook. A failed dump is answered with a full
// sync, as the iptables mode's canaries are: its rebuild fails at the same dump
// if it persists, and the error is then reported and retried as any failed
// sync's. The full sync after a change seen counts at least one repair. (Two
// dsproxy processes at once, as during a surge rollout, delete each other's
// table at each swap and so rebuild at every check.)
func (b *Backend) Flushed(ctx context.Context) bool {
	if b.table == "" || b.c == nil {
		return false // the next sync builds the table anyway
	}
	for _, bc := range baseChains {
		got, err := b.k.ListRules(ctx, b.f, b.table, bc.name)
		if err != nil {
			klog.InfoS("Could not read an nftables base chain; resyncing everything", "ipFamily", b.f.Name, "table", b.table, "chain", bc.name, "err", err)
			return true
		}
		// A table or chain that is gone reads as no rules; every base chain
		// has at least one.
		if want := b.c.chains[bc.name]; want == nil || !rulesEqual(got, want.Rules) {
			klog.V(2).InfoS("nftables base chain gone or changed by someone else", "ipFamily", b.f.Name, "table", b.table, "chain", bc.name, "rules", len(got))
			b.flushSeen = true
			return true
		}
	}
	return false
}

// Sync implements proxier.Backend. The first sync, the sync after a failure, every
// RebuildEvery-th full sync and a full sync that finds the table or a base chain
// gone rebuild the table under its other name and swap it in, without removing the
// working rules first. Otherwise a sync is one transaction of element operations for
// req.Changed (all ports when req.NodeChanged), plus the chains of an endpoint
// count that first appears (see doc.go). A full sync also reads back the chains and every set
// except the endpoint and affinity maps, repairs differences (counted in
// SyncResult.Repairs) and garbage-collects unused dispatch groups.
//
// On error the kernel may hold a partial sync; the backend then rebuilds on its
// next sync, whatever req says.
func (b *Backend) Sync(ctx context.Context, req *proxier.SyncRequest) (SyncResult, error) {
	seen := b.flushSeen
	b.flushSeen = false
	res, err := b.sync(ctx, req)
	switch {
	case seen && err == nil && req != nil && req.Full:
		res.Repairs = max(res.Repairs, 1) // what Flushed saw
	case seen && err != nil:
		b.flushSeen = true // the retry repairs it
	}
	if err != nil && ctx.Err() == nil {
		res.NFTablesFailed = true
	}
	return res, err
}

func (b *Backend) sync(ctx context.Context, req *proxier.SyncRequest) (SyncResult, error) {
	if req == nil || req.State == nil || req.Node == nil {
		return SyncResult{}, fmt.Errorf("nftables %s: sync request without state or node config", b.f)
	}
	if b.c == nil || b.dirty {
		return b.rebuild(ctx, req, 0)
	}
	if req.Full {
		b.fullSyncs++
		if b.opts.RebuildEvery > 0 && b.fullSyncs%b.opts.RebuildEvery == 0 {
			return b.rebuild(ctx, req, 0)
		}
	}
	tx := nft.NewTx(b.f)
	var res SyncResult
	if req.Full {
		repairs, rebuild, err := b.verify(ctx, tx)
		if err != nil {
			return res, err
		}
		if rebuild {
			return b.rebuild(ctx, req, repairs)
		}
		res.Repairs = repairs
	}
	b.update(req)
	p := b.c.drain(b.table, req.Full)
	p.chains = b.c.chainOps(b.table)
	moves := b.affordable(b.c.takeMoves())
	ghosts := keepGhosts(p, b.c, moves)
	tx.Ops = slices.Concat(tx.Ops, p.addSets, p.deletes, p.adds, p.chains, p.delSets)
	if err := b.apply(ctx, tx, &res); err != nil {
		return res, fmt.Errorf("nftables %s: sync of %d service ports: %w", b.f, len(req.Changed), err)
	}
	if len(moves) > 0 {
		b.moveAffinity(ctx, moves, ghosts, &res)
	}
	return res, nil
}

// SyncResult is proxier.SyncResult.
type SyncResult = proxier.SyncResult

// update applies req to the cache: the node settings and the ports they affect, or
// the changed ports.
func (b *Backend) update(req *proxier.SyncRequest) {
	all := req.Full || req.NodeChanged
	if all {
		b.c.setNode(req.Node)
	}
	for _, name := range portNames(b.c, req, all) {
		b.c.setPort(name, req.State.Ports[name])
	}
}

// portNames returns the ports to recompute: req.Changed, or with all every port in
// the state and the cache (those only in the cache are deletions), sorted so owner
// ids and output are deterministic.
func portNames(c *cache, req *proxier.SyncRequest, all bool) []model.ServicePortName {
	if !all {
		return req.Changed
	}
	names := make([]model.ServicePortName, 0, len(req.State.Ports)+len(c.ports))
	for n := range req.State.Ports {
		names = append(names, n)
	}
	for n := range c.ports {
		if _, ok := req.State.Ports[n]; !ok {
			names = append(names, n)
		}
	}
	slices.SortFunc(names, model.ServicePortName.Compare)
	return names
}

// apply commits tx unless it is empty, counting into res. On failure the backend
// is marked dirty.
func (b *Backend) apply(ctx context.Context, tx *nft.Tx, res *SyncResult) error {
	if len(tx.Ops) == 0 {
		return nil
	}
	if err := b.k.Apply(ctx, tx); err != nil {
		b.dirty = true
		return err
	}
	res.Transactions++
	res.Operations += countOps(tx)
	return nil
}

func countOps(tx *nft.Tx) int {
	n := 0
	for _, op := range tx.Ops {
		switch op.Kind {
		case nft.OpAddElements, nft.OpDeleteElements:
			n += len(op.Elements)
		default:
			n++
		}
	}
	return n
}

// Cleanup deletes every table the backend may have created, in both families (a
// previous run may have served the other one). Absent tables are not an error.
func (b *Backend) Cleanup(ctx context.Context) error {
	var errs []error
	for _, f := range []*family.Family{b.f, b.f.Other()} {
		tx := nft.NewTx(f)
		for _, t := range TableNames {
			tx.DeleteTable(t)
		}
		if err := b.k.Apply(ctx, tx); err != nil {
			errs = append(errs, fmt.Errorf("nftables %s: cleanup of tables %v: %w", f, TableNames, err))
		}
	}
	b.c, b.table, b.dirty = nil, "", false
	return errors.Join(errs...)
}
