package nft

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// Netlink is the Kernel of the running system (or of a network namespace), spoken
// to over netlink with google/nftables. It keeps one lasting netlink socket, so a
// transaction costs tens of microseconds instead of the ~16 ms of a socket per
// Flush. All methods are serialized; one Netlink may serve both families, or each
// family may have its own (independent sockets; the kernel still serializes
// commits per namespace).
type Netlink struct {
	mu     sync.Mutex
	conn   *nftables.Conn // encodes messages; lists
	opts   []nftables.ConnOption
	closed bool

	// Transactions go out on a socket of their own as batches encoded by batch
	// (see batchWriter), when the library's queue can be reached (batchable);
	// otherwise through conn.Flush.
	batchConn *netlink.Conn
	batch     batchWriter
	seq       uint32
	rbuf      []byte
}

// batchable: google/nftables' queue and encoding error can be reached (see
// queuedMessages), so Netlink sends its own batches.
var batchable = haveMessages && haveErr

var _ Kernel = (*Netlink)(nil)

// NetlinkOption configures NewNetlink.
type NetlinkOption func(*netlinkConfig)

type netlinkConfig struct {
	netns   int
	hasNS   bool
	sockBuf int
}

// WithNetNSFd makes the Netlink talk to the network namespace open at fd (tests).
func WithNetNSFd(fd int) NetlinkOption {
	return func(c *netlinkConfig) { c.netns, c.hasNS = fd, true }
}

// WithSocketBuffer sets the netlink socket send and receive buffers (default
// DefaultSocketBuffer).
func WithSocketBuffer(bytes int) NetlinkOption {
	return func(c *netlinkConfig) { c.sockBuf = bytes }
}

// DefaultSocketBuffer is the netlink socket buffer size. Without large buffers a
// cold load of 10k services fails with EMSGSIZE (sendmsg) or ENOBUFS (acks).
const DefaultSocketBuffer = 64 << 20

// maxElementBytes bounds the encoded element list of one message. google/nftables
// marshals the whole list into one netlink attribute whose length is a u16: a list
// over 64 KiB silently overflows it and the kernel drops elements while the
// transaction still succeeds.
const maxElementBytes = 60 << 10

// NewNetlink opens the lasting netlink socket.
func NewNetlink(opts ...NetlinkOption) (*Netlink, error) {
	cfg := netlinkConfig{sockBuf: DefaultSocketBuffer}
	for _, o := range opts {
		o(&cfg)
	}
	copts := []nftables.ConnOption{nftables.AsLasting(), nftables.WithSockOptions(sockBuffers(cfg.sockBuf))}
	if cfg.hasNS {
		copts = append(copts, nftables.WithNetNSFd(cfg.netns))
	}
	n := &Netlink{opts: copts}
	if err := n.redial(); err != nil {
		return nil, err
	}
	if batchable {
		ncfg := &netlink.Config{}
		if cfg.hasNS {
			ncfg.NetNS = cfg.netns
		}
		c, err := netlink.Dial(unix.NETLINK_NETFILTER, ncfg)
		if err != nil {
			_ = n.conn.CloseLasting()
			return nil, fmt.Errorf("nft: open netlink socket: %w", err)
		}
		// Error replies carry the failing message's header, not the message.
		err = errors.Join(sockBuffers(cfg.sockBuf)(c), c.SetOption(netlink.CapAcknowledge, true))
		if err != nil {
			_ = c.Close()
			_ = n.conn.CloseLasting()
			return nil, fmt.Errorf("nft: netlink socket options: %w", err)
		}
		n.batchConn = c
	}
	return n, nil
}

func (n *Netlink) redial() error {
	c, err := nftables.New(n.opts...)
	if err != nil {
		return fmt.Errorf("nft: open netlink socket: %w", err)
	}
	if n.conn != nil {
		_ = n.conn.CloseLasting()
	}
	n.conn = c
	return nil
}

// sockBuffers raises both socket buffers past rmem_max/wmem_max with the FORCE
// options (CAP_NET_ADMIN, which programming nftables needs anyway), falling back to
// the capped options without it.
func sockBuffers(size int) nftables.SockOption {
	return func(c *netlink.Conn) error {
		_ = c.SetOption(netlink.ExtendedAcknowledge, true) // better kernel error text
		rc, err := c.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := rc.Control(func(fd uintptr) {
			for _, opt := range []int{unix.SO_SNDBUFFORCE, unix.SO_RCVBUFFORCE} {
				if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt, size); e != nil {
					serr = e
				}
			}
		}); err != nil {
			return err
		}
		if errors.Is(serr, unix.EPERM) {
			if err := c.SetWriteBuffer(size); err != nil {
				return err
			}
			return c.SetReadBuffer(size)
		}
		return serr
	}
}

// Close closes the netlink socket; the Netlink must not be used afterwards.
func (n *Netlink) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
	err := n.conn.CloseLasting()
	if n.batchConn != nil {
		err = errors.Join(err, n.batchConn.Close())
	}
	return err
}

var errClosed = errors.New("nft: netlink closed")

// Apply sends tx as one netlink batch, which the kernel commits atomically. On
// failure nothing is applied; the error wraps the kernel's errno (errors.Is works
// with syscall.ENOENT and the like) and names the failing operations (the kernel
// reports a failing message by sequence number; Netlink's own batches map it back
// to the operation). On the fallback through google/nftables' Flush, which does
// not surface sequence numbers, the error lists what the transaction touched.
func (n *Netlink) Apply(ctx context.Context, tx *Tx) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if tx == nil || tx.Family == nil {
		return fmt.Errorf("nft: transaction without family: %w", syscall.EINVAL)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return errClosed
	}
	if len(tx.Ops) == 0 {
		return nil
	}
	fam := nftables.TableFamily(tx.Family.NFProto)
	if n.batchConn != nil {
		return n.applyBatch(fam, tx)
	}
	for i, op := range tx.Ops {
		if err := n.queue(fam, op); err != nil {
			// The Conn keeps queued messages until the next Flush; drop them with it.
			if rerr := n.redial(); rerr != nil {
				err = errors.Join(err, rerr)
			}
			return fmt.Errorf("nft %s: op %d (%s %s): %w", tx.Family, i, op.Kind, op.object(), err)
		}
	}
	if err := n.conn.Flush(); err != nil {
		return fmt.Errorf("nft %s: transaction of %d ops on %s: %w", tx.Family, len(tx.Ops), txObjects(tx), err)
	}
	return nil
}

// txObjects summarizes what a transaction touches, for errors.
func txObjects(tx *Tx) string {
	seen := map[string]bool{}
	var objs []string
	for _, op := range tx.Ops {
		if o := op.object(); !seen[o] {
			seen[o] = true
			objs = append(objs, o)
		}
	}
	if len(objs) > 8 {
		objs = append(objs[:8], fmt.Sprintf("and %d more", len(objs)-8))
	}
	return strings.Join(objs, ", ")
}

// setIDs allocates set IDs: google/nftables increments an unprotected global when a
// Set has no ID, which races between Netlinks.
var setIDs atomic.Uint32

func (n *Netlink) queue(fam nftables.TableFamily, op Op) error {
	t := &nftables.Table{Name: op.Table, Family: fam}
	switch op.Kind {
	case OpAddTable:
		n.conn.AddTable(t)
	case OpDeleteTable:
		// Creating the table first makes the delete succeed when it is absent (the
		// library has no NFT_MSG_DESTROYTABLE).
		n.conn.AddTable(t)
		n.conn.DelTable(t)
	case OpAddSet:
		if op.Set == nil {
			return syscall.EINVAL
		}
		return n.conn.AddSet(nfSet(t, op.Set), nil)
	case OpDeleteSet:
		n.conn.DelSet(&nftables.Set{Table: t, Name: op.SetName})
	case OpSetChain:
		return n.setChain(t, op.Chain)
	case OpAppendRules:
		if op.Chain == nil || op.Chain.Name == "" {
			return syscall.EINVAL
		}
		ch := &nftables.Chain{Table: t, Name: op.Chain.Name}
		for _, r := range op.Chain.Rules {
			n.conn.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r.Exprs, UserData: ruleUserData(r.Comment)})
		}
	case OpDeleteChain:
		n.conn.DelChain(&nftables.Chain{Table: t, Name: op.Name})
	case OpAddElements, OpDeleteElements:
		return n.elements(t, op)
	case OpFlushSet:
		n.conn.FlushSet(&nftables.Set{Table: t, Name: op.SetName})
	default:
		return fmt.Errorf("unknown operation %d: %w", op.Kind, syscall.EOPNOTSUPP)
	}
	return nil
}

// nfSet converts a Set. Interval is never set: interval+concat selects the pipapo
// backend, which copies the whole set on every commit.
func nfSet(t *nftables.Table, s *Set) *nftables.Set {
	return &nftables.Set{
		Table: t, ID: setIDs.Add(1), Name: s.Name,
		IsMap: s.IsMap, Concatenation: s.Concat, HasTimeout: s.Timeout, Dynamic: s.Dynamic,
		KeyType: s.KeyType, DataType: s.DataType, Size: s.Size, Comment: s.Comment,
	}
}

func (n *Netlink) setChain(t *nftables.Table, c *Chain) error {
	if c == nil || c.Name == "" {
		return syscall.EINVAL
	}
	if (c.Hook == nil) != (c.Priority == nil) {
		return fmt.Errorf("hook and priority must be set together: %w", syscall.EINVAL)
	}
	ch := n.conn.AddChain(&nftables.Chain{Name: c.Name, Table: t, Hooknum: c.Hook, Priority: c.Priority, Type: c.Type})
	n.conn.FlushChain(ch)
	for _, r := range c.Rules {
		n.conn.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r.Exprs, UserData: ruleUserData(r.Comment)})
	}
	return nil
}

// elements queues element messages, each under maxElementBytes encoded. The
// library encodes a list when it is queued, so one conversion buffer serves every
// message of the operation.
func (n *Netlink) elements(t *nftables.Table, op Op) error {
	keysOnly := op.Kind == OpDeleteElements
	if q := queuedMessages(n.conn); q != nil && !slices.ContainsFunc(op.Elements, func(e Element) bool { return e.Verdict != nil }) {
		for elems := op.Elements; len(elems) > 0; {
			k := elementsFitting(elems, keysOnly)
			*q = append(*q, elementMessage(t.Family, t.Name, op.SetName, elems[:k], keysOnly))
			elems = elems[k:]
		}
		return nil
	}
	s := &nftables.Set{Table: t, Name: op.SetName, HasTimeout: slices.ContainsFunc(op.Elements, func(e Element) bool { return e.Timeout > 0 })}
	queue := func(chunk []nftables.SetElement) error {
		if keysOnly {
			return n.conn.SetDeleteElements(s, chunk)
		}
		return n.conn.SetAddElements(s, chunk)
	}
	var buf []nftables.SetElement
	size := 0
	for _, e := range op.Elements {
		se := nftables.SetElement{Key: e.Key}
		if !keysOnly {
			se.Val, se.VerdictData, se.Timeout = e.Data, e.Verdict, e.Timeout
		}
		sz := encodedElementSize(se)
		if len(buf) > 0 && size+sz > maxElementBytes {
			if err := queue(buf); err != nil {
				return err
			}
			buf, size = buf[:0], 0
		}
		if buf == nil {
			buf = make([]nftables.SetElement, 0, min(len(op.Elements), maxElementBytes/sz+1))
		}
		buf = append(buf, se)
		size += sz
	}
	if len(buf) > 0 {
		return queue(buf)
	}
	return nil
}

// elementsFitting is how many of elems (at least one) fit in one message's
// maxElementBytes.
func elementsFitting(elems []Element, keysOnly bool) int {
	k, size := 0, 0
	for ; k < len(elems); k++ {
		sz := encodedElementSize(nftables.SetElement{Key: elems[k].Key, Val: elems[k].Data, Timeout: elems[k].Timeout})
		if keysOnly {
			sz = encodedElementSize(nftables.SetElement{Key: elems[k].Key})
		}
		if k > 0 && size+sz > maxElementBytes {
			break
		}
		size += sz
	}
	return k
}

func align4(n int) int { return (n + 3) &^ 3 }

// encodedElementSize is the netlink encoding of one element as google/nftables
// makes it: a list item holding a nested key (and data or verdict) value.
func encodedElementSize(e nftables.SetElement) int {
	n := 4 + 4 + 4 + align4(len(e.Key)) // item, NFTA_SET_ELEM_KEY, NFTA_DATA_VALUE
	if e.Timeout > 0 {
		n += 4 + 8 // NFTA_SET_ELEM_TIMEOUT
	}
	switch {
	case e.VerdictData != nil:
		n += 4 + 4 + 4 + 4 + 8 + 4 + align4(len(e.VerdictData.Chain)+1)
	case len(e.Val) > 0:
		n += 4 + 4 + align4(len(e.Val))
	}
	return n
}

// ListTables returns the names of the family's tables, sorted.
func (n *Netlink) ListTables(ctx context.Context, f *family.Family) ([]string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, errClosed
	}
	ts, err := n.conn.ListTablesOfFamily(nftables.TableFamily(f.NFProto))
	if err != nil {
		return nil, fmt.Errorf("nft %s: list tables: %w", f, err)
	}
	var names []string
	for _, t := range ts {
		names = append(names, t.Name)
	}
	sort.Strings(names)
	return names, nil
}

// ListChains returns the chains of table, sorted by name, with their rules as the
// kernel dumps them. Expressions google/nftables cannot decode are left out of the
// rules, and some fields differ from what was sent (set IDs, counter values, the
// NAT proto-specified flag); compare rules with FormatRule, which ignores those.
func (n *Netlink) ListChains(ctx context.Context, f *family.Family, table string) ([]*Chain, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, errClosed
	}
	fam := nftables.TableFamily(f.NFProto)
	t, err := n.conn.ListTableOfFamily(table, fam)
	if err != nil {
		return nil, fmt.Errorf("nft %s: table %s: %w", f, table, err)
	}
	all, err := n.conn.ListChainsOfTableFamily(fam)
	if err != nil {
		return nil, fmt.Errorf("nft %s: list chains of %s: %w", f, table, err)
	}
	var out []*Chain
	for _, c := range all {
		if c.Table == nil || c.Table.Name != table {
			continue
		}
		rules, err := n.conn.GetRules(t, c)
		if err != nil {
			return nil, fmt.Errorf("nft %s: rules of chain %s/%s: %w", f, table, c.Name, err)
		}
		ch := &Chain{Name: c.Name, Type: c.Type}
		if c.Hooknum != nil {
			ch.Hook, ch.Priority = c.Hooknum, c.Priority
		}
		for _, r := range rules {
			ch.Rules = append(ch.Rules, Rule{Exprs: r.Exprs, Comment: ruleComment(r.UserData)})
		}
		out = append(out, ch)
	}
	slices.SortFunc(out, func(a, b *Chain) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// ListRules returns the rules of one chain as the kernel dumps them (see
// ListChains), with one dump. The kernel answers a dump for a table or chain
// that does not exist with no rules.
func (n *Netlink) ListRules(ctx context.Context, f *family.Family, table, chain string) ([]Rule, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, errClosed
	}
	t := &nftables.Table{Name: table, Family: nftables.TableFamily(f.NFProto)}
	rules, err := n.conn.GetRules(t, &nftables.Chain{Name: chain, Table: t})
	if err != nil {
		return nil, fmt.Errorf("nft %s: rules of chain %s/%s: %w", f, table, chain, err)
	}
	out := make([]Rule, 0, len(rules))
	for _, r := range rules {
		out = append(out, Rule{Exprs: r.Exprs, Comment: ruleComment(r.UserData)})
	}
	return out, nil
}

// ListElements returns the elements of a set sorted by key. Beware: google/nftables
// decodes the dump superlinearly; 100k elements take 5-17 s and 300k about a
// minute. Use it for small sets and samples, not for a full drift check of the
// endpoint map.
func (n *Netlink) ListElements(ctx context.Context, f *family.Family, table, set string) ([]Element, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, errClosed
	}
	// A dump walks the kernel's hash table, and a walk that overlaps the table's
	// deferred resize (right after a big load) can return an element twice and miss
	// another. Such a dump is read again.
	for try := 1; ; try++ {
		out, err := n.listElements(f, table, set)
		if err != nil || try == 5 || !hasDuplicateKeys(out) {
			return slices.CompactFunc(out, func(a, b Element) bool { return bytes.Equal(a.Key, b.Key) }), err
		}
		time.Sleep(time.Duration(try) * 10 * time.Millisecond)
	}
}

func hasDuplicateKeys(sorted []Element) bool {
	for i := 1; i < len(sorted); i++ {
		if bytes.Equal(sorted[i-1].Key, sorted[i].Key) {
			return true
		}
	}
	return false
}

func (n *Netlink) listElements(f *family.Family, table, set string) ([]Element, error) {
	t := &nftables.Table{Name: table, Family: nftables.TableFamily(f.NFProto)}
	s, err := n.conn.GetSetByName(t, set)
	if err != nil {
		return nil, fmt.Errorf("nft %s: set %s/%s: %w", f, table, set, err)
	}
	// google/nftables decodes a verdict data type into KeyType (a bug), so a verdict
	// map is recognizable by its key type.
	vmap := s.IsMap && isVerdictType(s.KeyType)
	els, err := n.conn.GetSetElements(s)
	if err != nil {
		return nil, fmt.Errorf("nft %s: elements of %s/%s: %w", f, table, set, err)
	}
	out := make([]Element, 0, len(els))
	for _, e := range els {
		el := Element{Key: e.Key}
		switch {
		case vmap:
			v, err := decodeVerdict(e.Val)
			if err != nil {
				return nil, fmt.Errorf("nft %s: element of %s/%s: %w", f, table, set, err)
			}
			el.Verdict = v
		case s.IsMap:
			el.Data = e.Val
		}
		el.Timeout, el.Expires = e.Timeout, e.Expires
		out = append(out, el)
	}
	slices.SortFunc(out, func(a, b Element) int { return strings.Compare(string(a.Key), string(b.Key)) })
	return out, nil
}

// decodeVerdict decodes the NFTA_DATA_VERDICT attributes google/nftables returns as
// the raw value of a verdict map element.
func decodeVerdict(b []byte) (*expr.Verdict, error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return nil, err
	}
	v := &expr.Verdict{}
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_VERDICT_CODE:
			v.Kind = expr.VerdictKind(int32(binaryutil.BigEndian.Uint32(ad.Bytes())))
		case unix.NFTA_VERDICT_CHAIN:
			v.Chain = ad.String()
		}
	}
	return v, ad.Err()
}
