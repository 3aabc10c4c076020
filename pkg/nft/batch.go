package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// A transaction is one nfnetlink batch (BATCH_BEGIN, the messages, BATCH_END) in
// one sendmsg: the kernel only commits a batch that arrives whole. google/nftables'
// Flush marshals every queued message into its own buffer and appends them all into
// one growing buffer, which at a cold start of 10k services allocated ~85 MB (both
// families) for batches a quarter that size. batchWriter encodes the batch once, message by message,
// into chunks of chunkSize bytes that sendmsg gathers (one iovec per chunk); element
// lists are encoded straight into it.
//
// Replies: nfnetlink processes a batch synchronously inside sendmsg, so every
// reply is queued on the socket when sendmsg returns. Only the last message asks
// for an acknowledgement and no message asks for an echo: a successful batch
// produces exactly one reply, a failed one an error per failing message (or one
// for the batch when the commit fails), each naming the message by sequence number,
// which maps back to the transaction's operation.

// chunkSize is the size of a batch chunk (a message larger than that gets a chunk of
// its own). Variable for tests.
var chunkSize = 1 << 20

// maxChunks is UIO_MAXIOV: sendmsg's limit on iovecs.
const maxChunks = 1024

const nlmsgHeaderLen = 16

type batchWriter struct {
	chunks  [][]byte
	spare   []byte  // one chunk kept across transactions
	ops     []int32 // operation index of each message; -1 for BATCH_BEGIN
	seq     uint32  // sequence number of BATCH_BEGIN
	nextSeq uint32
	last    []byte // header of the last message written
}

func (w *batchWriter) reset(seq uint32) {
	w.chunks = w.chunks[:0]
	w.ops = w.ops[:0]
	w.seq, w.nextSeq, w.last = seq, seq, nil
}

// release drops the chunks of a sent batch, keeping one for the next.
func (w *batchWriter) release() {
	if w.spare == nil && len(w.chunks) > 0 && cap(w.chunks[0]) == chunkSize {
		w.spare = w.chunks[0][:0]
	}
	clear(w.chunks)
	w.chunks = w.chunks[:0]
	w.last = nil
	if cap(w.ops) > 4096 {
		w.ops = nil
	}
}

// messages is the number of messages written, BATCH_BEGIN included.
func (w *batchWriter) messages() int { return len(w.ops) }

// message writes a message header for a payload of size bytes and returns the
// payload to fill (zeroed up to its 4-byte alignment).
func (w *batchWriter) message(typ uint16, flags netlink.HeaderFlags, size int, op int) []byte {
	total := nlmsgHeaderLen + align4(size)
	var c []byte
	if n := len(w.chunks); n > 0 && cap(w.chunks[n-1])-len(w.chunks[n-1]) >= total {
		c = w.chunks[n-1]
	} else {
		switch {
		case total > chunkSize:
			c = make([]byte, 0, total)
		case w.spare != nil:
			c, w.spare = w.spare, nil
		default:
			c = make([]byte, 0, chunkSize)
		}
		w.chunks = append(w.chunks, c)
	}
	start := len(c)
	c = c[:start+total]
	w.chunks[len(w.chunks)-1] = c
	m := c[start:]
	binary.NativeEndian.PutUint32(m[0:], uint32(nlmsgHeaderLen+size))
	binary.NativeEndian.PutUint16(m[4:], typ)
	binary.NativeEndian.PutUint16(m[6:], uint16(flags))
	binary.NativeEndian.PutUint32(m[8:], w.nextSeq)
	binary.NativeEndian.PutUint32(m[12:], 0) // port id: the kernel's
	w.nextSeq++
	w.ops = append(w.ops, int32(op))
	w.last = m[:nlmsgHeaderLen]
	payload := m[nlmsgHeaderLen:]
	clear(payload[size:])
	return payload[:size]
}

// batchMarker writes BATCH_BEGIN or BATCH_END (nfgenmsg with the nftables
// subsystem as resource id).
func (w *batchWriter) batchMarker(typ uint16) {
	p := w.message(typ, netlink.Request, 4, -1)
	p[0], p[1] = unix.AF_UNSPEC, unix.NFNETLINK_V0
	binary.BigEndian.PutUint16(p[2:], unix.NFNL_SUBSYS_NFTABLES)
}

// copyMessage writes a message queued by google/nftables, without its
// acknowledgement and echo requests (see above).
func (w *batchWriter) copyMessage(m netlink.Message, op int) {
	flags := m.Header.Flags &^ (netlink.Acknowledge | netlink.Echo)
	copy(w.message(uint16(m.Header.Type), flags, len(m.Data), op), m.Data)
}

// finish asks for the acknowledgement of the last message and writes BATCH_END.
// It returns the sequence number acknowledged on success.
func (w *batchWriter) finish() uint32 {
	h := w.last
	binary.NativeEndian.PutUint16(h[6:], binary.NativeEndian.Uint16(h[6:])|uint16(netlink.Acknowledge))
	acked := binary.NativeEndian.Uint32(h[8:])
	w.batchMarker(unix.NFNL_MSG_BATCH_END)
	return acked
}

// send writes the batch to the socket fd in one sendmsg.
func (w *batchWriter) send(fd int) error {
	if len(w.chunks) > maxChunks {
		return fmt.Errorf("batch of %d chunks exceeds %d iovecs: %w", len(w.chunks), maxChunks, syscall.EMSGSIZE)
	}
	for {
		_, err := unix.SendmsgBuffers(fd, w.chunks, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0)
		if err == unix.EINTR {
			continue
		}
		return err
	}
}

// reply is one NLMSG_ERROR message: an acknowledgement (errno 0) or an error.
type reply struct {
	seq    uint32
	errno  syscall.Errno
	extack string
}

// parseReplies decodes the NLMSG_ERROR messages of a datagram; others (there should
// be none) are skipped.
func parseReplies(b []byte, out []reply) ([]reply, error) {
	for len(b) >= nlmsgHeaderLen {
		l := int(binary.NativeEndian.Uint32(b[0:]))
		if l < nlmsgHeaderLen || l > len(b) {
			return out, fmt.Errorf("malformed netlink reply (length %d of %d bytes)", l, len(b))
		}
		typ := binary.NativeEndian.Uint16(b[4:])
		flags := binary.NativeEndian.Uint16(b[6:])
		data := b[nlmsgHeaderLen:l]
		if typ == unix.NLMSG_ERROR && len(data) >= 4+nlmsgHeaderLen {
			r := reply{
				errno: syscall.Errno(-int32(binary.NativeEndian.Uint32(data[0:]))),
				seq:   binary.NativeEndian.Uint32(data[4+8:]),
			}
			// Extended acknowledgement attributes follow the original header (and,
			// unless capped, its payload).
			off := 4 + int(binary.NativeEndian.Uint32(data[4:]))
			if flags&unix.NLM_F_CAPPED != 0 {
				off = 4 + nlmsgHeaderLen
			}
			if flags&unix.NLM_F_ACK_TLVS != 0 && off <= len(data) {
				r.extack = extackMessage(data[off:])
			}
			out = append(out, r)
		}
		b = b[min(align4(l), len(b)):]
	}
	return out, nil
}

// extackMessage returns NLMSGERR_ATTR_MSG from extended acknowledgement attributes.
func extackMessage(b []byte) string {
	for len(b) >= nlaHeaderLen {
		l := int(binary.NativeEndian.Uint16(b[0:]))
		typ := binary.NativeEndian.Uint16(b[2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if l < nlaHeaderLen || l > len(b) {
			return ""
		}
		if typ == unix.NLMSGERR_ATTR_MSG {
			return strings.TrimRight(string(b[nlaHeaderLen:l]), "\x00")
		}
		b = b[min(align4(l), len(b)):]
	}
	return ""
}

// batchResult turns the replies to a batch into its error: nil only when the
// acknowledgement of the last message arrived and nothing failed. describe names
// the operation of a message.
func (w *batchWriter) batchResult(replies []reply, acked uint32, describe func(op int) string) error {
	var errs []error
	ok, failed := false, 0
	for _, r := range replies {
		if r.errno == 0 {
			ok = ok || r.seq == acked
			continue
		}
		i := r.seq - w.seq
		if i >= uint32(len(w.ops)) {
			continue // not this batch's
		}
		if failed++; failed > maxReplyErrors {
			continue
		}
		what := "commit"
		if op := w.ops[i]; op >= 0 {
			what = describe(int(op))
		}
		err := fmt.Errorf("%s: %w", what, r.errno)
		if r.extack != "" {
			err = fmt.Errorf("%s: %w (%s)", what, r.errno, r.extack)
		}
		errs = append(errs, err)
	}
	switch {
	case failed > maxReplyErrors:
		return replyErrors(append(errs, fmt.Errorf("and %d more errors", failed-maxReplyErrors)))
	case len(errs) > 0:
		return replyErrors(errs)
	case !ok:
		return fmt.Errorf("no acknowledgement of the batch (message %d): %w", acked, syscall.EPROTO)
	}
	return nil
}

// maxReplyErrors bounds the errors a failed batch's error lists.
const maxReplyErrors = 8

// applyBatch sends tx as one batch of its own encoding (see batchWriter).
func (n *Netlink) applyBatch(fam nftables.TableFamily, tx *Tx) error {
	w := &n.batch
	w.reset(n.seq)
	defer func() {
		n.seq = w.nextSeq
		w.release()
	}()
	w.batchMarker(unix.NFNL_MSG_BATCH_BEGIN)
	q := queuedMessages(n.conn)
	for i, op := range tx.Ops {
		if (op.Kind == OpAddElements || op.Kind == OpDeleteElements) && !slices.ContainsFunc(op.Elements, func(e Element) bool { return e.Verdict != nil }) {
			if err := n.batchElements(fam, op, i); err != nil {
				return fmt.Errorf("nft %s: op %d (%s %s): %w", tx.Family, i, op.Kind, op.object(), err)
			}
			continue
		}
		err := n.queue(fam, op)
		if err == nil {
			err = queueErr(n.conn)
		}
		if err != nil {
			// A fresh Conn drops the queue and the library's sticky encoding error.
			if rerr := n.redial(); rerr != nil {
				err = errors.Join(err, rerr)
			}
			return fmt.Errorf("nft %s: op %d (%s %s): %w", tx.Family, i, op.Kind, op.object(), err)
		}
		for _, m := range *q {
			w.copyMessage(m, i)
		}
		clear(*q)
		*q = (*q)[:0]
	}
	if w.messages() == 1 {
		return nil // operations without messages (empty element lists)
	}
	acked := w.finish()
	rc, err := n.batchConn.SyscallConn()
	if err != nil {
		return fmt.Errorf("nft %s: %w", tx.Family, err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = w.send(int(fd)) }); err != nil {
		return fmt.Errorf("nft %s: %w", tx.Family, err)
	}
	if serr != nil {
		return fmt.Errorf("nft %s: send transaction of %d ops (%d messages) on %s: %w", tx.Family, len(tx.Ops), w.messages(), txObjects(tx), serr)
	}
	replies, err := n.receiveReplies(rc)
	if err != nil {
		return fmt.Errorf("nft %s: transaction of %d ops on %s: %w", tx.Family, len(tx.Ops), txObjects(tx), err)
	}
	err = w.batchResult(replies, acked, func(i int) string {
		return fmt.Sprintf("op %d (%s %s)", i, tx.Ops[i].Kind, tx.Ops[i].object())
	})
	if err != nil {
		return fmt.Errorf("nft %s: transaction of %d ops: %w", tx.Family, len(tx.Ops), err)
	}
	return nil
}

// batchElements encodes an element operation without verdicts straight into the
// batch, in messages under maxElementBytes of elements each.
func (n *Netlink) batchElements(fam nftables.TableFamily, op Op, i int) error {
	keysOnly := op.Kind == OpDeleteElements
	typ, flags := elementMessageType(keysOnly)
	flags &^= netlink.Acknowledge
	for elems := op.Elements; len(elems) > 0; {
		k := elementsFitting(elems, keysOnly)
		size, list := elementPayloadSize(op.Table, op.SetName, elems[:k], keysOnly)
		p := n.batch.message(typ, flags, size, i)
		if got := appendElementPayload(p[:0], fam, op.Table, op.SetName, elems[:k], keysOnly, list); len(got) != size {
			return fmt.Errorf("element message of %d bytes, %d reserved: %w", len(got), size, syscall.EINVAL)
		}
		elems = elems[k:]
	}
	return nil
}

// receiveReplies reads the replies queued on the batch socket.
func (n *Netlink) receiveReplies(rc syscall.RawConn) ([]reply, error) {
	if n.rbuf == nil {
		n.rbuf = make([]byte, 64<<10)
	}
	var out []reply
	for {
		var (
			nr   int
			rerr error
		)
		if err := rc.Control(func(fd uintptr) { nr, _, rerr = unix.Recvfrom(int(fd), n.rbuf, unix.MSG_DONTWAIT) }); err != nil {
			return out, err
		}
		switch rerr {
		case nil:
		case unix.EAGAIN:
			return out, nil
		case unix.EINTR:
			continue
		default:
			return out, rerr
		}
		var err error
		if out, err = parseReplies(n.rbuf[:nr], out); err != nil {
			return out, err
		}
	}
}

// replyErrors are the errors of a batch, on one line; errors.Is sees each.
type replyErrors []error

func (e replyErrors) Error() string {
	s := make([]string, len(e))
	for i, err := range e {
		s[i] = err.Error()
	}
	return strings.Join(s, "; ")
}

func (e replyErrors) Unwrap() []error { return e }
