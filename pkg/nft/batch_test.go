package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// frames splits a batch into its messages, checking that none spans two chunks.
func frames(t *testing.T, w *batchWriter) [][]byte {
	t.Helper()
	var out [][]byte
	for i, c := range w.chunks {
		for len(c) > 0 {
			if len(c) < nlmsgHeaderLen {
				t.Fatalf("chunk %d: %d stray bytes", i, len(c))
			}
			l := align4(int(binary.NativeEndian.Uint32(c)))
			if l > len(c) {
				t.Fatalf("chunk %d: message of %d bytes crosses the chunk's end (%d left)", i, l, len(c))
			}
			out = append(out, c[:l])
			c = c[l:]
		}
	}
	return out
}

func TestBatchWriter(t *testing.T) {
	defer func(old int) { chunkSize = old }(chunkSize)
	chunkSize = 256
	var w batchWriter
	for round := range 2 { // the second reuses the spare chunk
		w.reset(uint32(100 * (round + 1)))
		w.batchMarker(unix.NFNL_MSG_BATCH_BEGIN)
		var want [][]byte
		for i := range 20 {
			data := []byte(strings.Repeat(fmt.Sprint(i%10), 1+i*7)) // up to 134 bytes, unaligned
			want = append(want, data)
			w.copyMessage(netlink.Message{
				Header: netlink.Header{Type: 0x0a06, Flags: netlink.Request | netlink.Acknowledge | netlink.Echo | netlink.Create},
				Data:   data,
			}, i/2)
		}
		big := make([]byte, 1000) // larger than a chunk: a chunk of its own
		want = append(want, big)
		w.copyMessage(netlink.Message{Header: netlink.Header{Type: 0x0a0c, Flags: netlink.Request}, Data: big}, 10)
		acked := w.finish()

		msgs := frames(t, &w)
		if len(msgs) != len(want)+2 || w.messages() != len(msgs) {
			t.Fatalf("%d messages (writer says %d), want %d", len(msgs), w.messages(), len(want)+2)
		}
		seq := w.seq
		for i, m := range msgs {
			typ := binary.NativeEndian.Uint16(m[4:])
			flags := netlink.HeaderFlags(binary.NativeEndian.Uint16(m[6:]))
			if got := binary.NativeEndian.Uint32(m[8:]); got != seq+uint32(i) {
				t.Errorf("message %d: seq %d, want %d", i, got, seq+uint32(i))
			}
			switch {
			case i == 0 || i == len(msgs)-1:
				wantType := uint16(unix.NFNL_MSG_BATCH_BEGIN)
				if i > 0 {
					wantType = unix.NFNL_MSG_BATCH_END
				}
				if typ != wantType || binary.BigEndian.Uint16(m[nlmsgHeaderLen+2:]) != unix.NFNL_SUBSYS_NFTABLES {
					t.Errorf("message %d: type %#x, res id %x; want batch marker %#x", i, typ, m[nlmsgHeaderLen+2:], wantType)
				}
			default:
				data := want[i-1]
				if l := binary.NativeEndian.Uint32(m); int(l) != nlmsgHeaderLen+len(data) || string(m[nlmsgHeaderLen:l]) != string(data) {
					t.Errorf("message %d: length %d / payload differ", i, l)
				}
				if flags&netlink.Echo != 0 {
					t.Errorf("message %d asks for an echo", i)
				}
				last := i == len(msgs)-2
				if (flags&netlink.Acknowledge != 0) != last {
					t.Errorf("message %d: acknowledge %v, want only on the last", i, flags&netlink.Acknowledge != 0)
				}
				if last && binary.NativeEndian.Uint32(m[8:]) != acked {
					t.Errorf("finish returned %d, the last message is %d", acked, binary.NativeEndian.Uint32(m[8:]))
				}
			}
		}
		if len(w.chunks) < 5 {
			t.Errorf("%d chunks of %d bytes for %d bytes", len(w.chunks), chunkSize, len(msgs)*20)
		}
		w.release()
		if w.spare == nil || len(w.chunks) != 0 {
			t.Errorf("release kept %d chunks, spare %v", len(w.chunks), w.spare != nil)
		}
	}
}

// errMsg encodes an NLMSG_ERROR reply to seq (capped, with an extended ack
// message when ext != "").
func errMsg(seq uint32, errno syscall.Errno, ext string) []byte {
	flags := uint16(unix.NLM_F_CAPPED)
	var tlv []byte
	if ext != "" {
		flags |= unix.NLM_F_ACK_TLVS
		tlv = appendStringAttr(nil, unix.NLMSGERR_ATTR_MSG, ext)
	}
	b := binary.NativeEndian.AppendUint32(nil, 0)
	b = binary.NativeEndian.AppendUint16(b, unix.NLMSG_ERROR)
	b = binary.NativeEndian.AppendUint16(b, flags)
	b = binary.NativeEndian.AppendUint32(b, 7)
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = binary.NativeEndian.AppendUint32(b, uint32(-int32(errno)))
	// the original header: length 5000 (not the capped copy's), seq
	b = binary.NativeEndian.AppendUint32(b, 5000)
	b = binary.NativeEndian.AppendUint32(b, 0x0a0c)
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = append(b, tlv...)
	binary.NativeEndian.PutUint32(b, uint32(len(b)))
	return b
}

func TestBatchReplies(t *testing.T) {
	w := batchWriter{seq: 40, ops: []int32{-1, 0, 0, 1, 2}} // BATCH_BEGIN 40, messages 41..44
	describe := func(op int) string { return fmt.Sprintf("op %d", op) }
	parse := func(datagrams ...[]byte) []reply {
		t.Helper()
		var out []reply
		for _, d := range datagrams {
			var err error
			if out, err = parseReplies(d, out); err != nil {
				t.Fatal(err)
			}
		}
		return out
	}

	if err := w.batchResult(parse(errMsg(44, 0, "")), 44, describe); err != nil {
		t.Errorf("acknowledged batch: %v", err)
	}
	if err := w.batchResult(nil, 44, describe); !errors.Is(err, syscall.EPROTO) {
		t.Errorf("batch without any reply: %v, want EPROTO", err)
	}
	// A stale acknowledgement of another batch is not this one's.
	if err := w.batchResult(parse(errMsg(12, 0, "")), 44, describe); err == nil {
		t.Error("an acknowledgement of another sequence number accepted")
	}

	replies := parse(append(errMsg(42, syscall.ENOENT, "Set not found"), errMsg(43, 0, "")...), errMsg(44, syscall.EEXIST, ""), errMsg(9, syscall.EBUSY, ""))
	if len(replies) != 4 || replies[0].extack != "Set not found" || replies[0].errno != syscall.ENOENT {
		t.Fatalf("replies %+v", replies)
	}
	err := w.batchResult(replies, 44, describe)
	if !errors.Is(err, syscall.ENOENT) || !errors.Is(err, syscall.EEXIST) || errors.Is(err, syscall.EBUSY) {
		t.Fatalf("errors %v: want ENOENT and EEXIST, not the other batch's EBUSY", err)
	}
	if got, want := err.Error(), "op 0: no such file or directory (Set not found); op 2: file exists"; got != want {
		t.Errorf("error %q, want %q", got, want)
	}
	if err := w.batchResult(parse(errMsg(40, syscall.ENOMEM, "")), 44, describe); err == nil || !strings.HasPrefix(err.Error(), "commit: ") {
		t.Errorf("error on BATCH_BEGIN: %v, want a commit error", err)
	}

	// Many failures: the first maxReplyErrors, then a count of the rest.
	many := batchWriter{seq: 1, ops: make([]int32, 21)}
	var replies20 []reply
	for i := range 20 {
		replies20 = append(replies20, reply{seq: uint32(2 + i), errno: syscall.ENOENT})
	}
	err = many.batchResult(append(replies20, reply{seq: 21}), 21, describe)
	if n := strings.Count(err.Error(), "no such file"); n != maxReplyErrors || !strings.HasSuffix(err.Error(), "and 12 more errors") {
		t.Errorf("20 failures: %d listed, error %q", n, err)
	}

	for _, bad := range [][]byte{
		{1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, // length 1
		errMsg(41, syscall.ENOENT, "x")[:30],             // length beyond the datagram
	} {
		if _, err := parseReplies(bad, nil); err == nil {
			t.Errorf("malformed reply %x accepted", bad)
		}
	}
}
