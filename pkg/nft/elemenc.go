package nft

import (
	"encoding/binary"
	"reflect"
	"unsafe"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Element lists are most of what a cold start sends (about 330k elements per family
// at 30k services). google/nftables converts each element into attribute structs
// and marshals them in several steps (about six allocations per element); here an
// element message is encoded directly, byte for byte as the library encodes it
// (see TestElementEncoding), and queued into the Conn's batch.
//
// The library has no way to queue a pre-encoded message, so queuedMessages reaches
// its unexported message list (Conn.messages, []netlink.Message) by reflection.
// When the field is missing or of another type (another library version),
// Netlink falls back to the library's SetAddElements/SetDeleteElements.

var messagesField = func() (off uintptr, ok bool) {
	f, found := reflect.TypeFor[nftables.Conn]().FieldByName("messages")
	if !found || f.Type != reflect.TypeFor[[]netlink.Message]() {
		return 0, false
	}
	return f.Offset, true
}

var messagesOffset, haveMessages = messagesField()

// errField finds Conn.err, where the library keeps the first error of encoding a
// queued message (its Flush returns it).
var errField = func() (off uintptr, ok bool) {
	f, found := reflect.TypeFor[nftables.Conn]().FieldByName("err")
	if !found || f.Type != reflect.TypeFor[error]() {
		return 0, false
	}
	return f.Offset, true
}

var errOffset, haveErr = errField()

// queueErr returns the Conn's encoding error. Only meaningful when haveErr.
func queueErr(c *nftables.Conn) error {
	return *(*error)(unsafe.Add(unsafe.Pointer(c), errOffset))
}

// queuedMessages returns the Conn's queue of batch messages, or nil. The caller
// holds the only reference to the Conn in use (Netlink.mu).
func queuedMessages(c *nftables.Conn) *[]netlink.Message {
	if !haveMessages {
		return nil
	}
	return (*[]netlink.Message)(unsafe.Add(unsafe.Pointer(c), messagesOffset))
}

const nlaHeaderLen = 4

func appendAttrHeader(b []byte, payload int, typ uint16) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(nlaHeaderLen+payload))
	return binary.NativeEndian.AppendUint16(b, typ)
}

func appendAttr(b []byte, typ uint16, data []byte) []byte {
	b = appendAttrHeader(b, len(data), typ)
	b = append(b, data...)
	return append(b, make([]byte, align4(len(data))-len(data))...)
}

func appendStringAttr(b []byte, typ uint16, s string) []byte {
	b = appendAttrHeader(b, len(s)+1, typ)
	b = append(b, s...)
	return append(b, make([]byte, align4(len(s)+1)-len(s))...)
}

// valueLen is the encoded size of a nested attribute holding one NFTA_DATA_VALUE.
func valueLen(v []byte) int { return nlaHeaderLen + nlaHeaderLen + align4(len(v)) }

// elementMessage encodes one NEWSETELEM (DELSETELEM when keysOnly) message for
// elems, which must have no verdicts, as google/nftables' SetAddElements and
// SetDeleteElements do for a Set without ID.
func elementMessage(fam nftables.TableFamily, table, set string, elems []Element, keysOnly bool) netlink.Message {
	typ, flags := elementMessageType(keysOnly)
	size, list := elementPayloadSize(table, set, elems, keysOnly)
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(typ), Flags: flags},
		Data:   appendElementPayload(make([]byte, 0, size), fam, table, set, elems, keysOnly, list),
	}
}

func elementMessageType(keysOnly bool) (uint16, netlink.HeaderFlags) {
	if keysOnly {
		return unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_DELSETELEM, netlink.Request | netlink.Acknowledge | netlink.Create
	}
	return unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWSETELEM, netlink.Request | netlink.Acknowledge | netlink.Create
}

// elementPayloadSize is the size of an element message's payload and of its
// element list attribute's payload.
func elementPayloadSize(table, set string, elems []Element, keysOnly bool) (size, list int) {
	for _, e := range elems {
		list += nlaHeaderLen + valueLen(e.Key)
		if !keysOnly && e.Timeout > 0 {
			list += nlaHeaderLen + 8
		}
		if !keysOnly && len(e.Data) > 0 {
			list += valueLen(e.Data)
		}
	}
	return 4 + 2*nlaHeaderLen + align4(len(set)+1) + align4(len(table)+1) + nlaHeaderLen + 4 + nlaHeaderLen + list, list
}

// appendElementPayload appends an element message's payload (list as computed by
// elementPayloadSize).
func appendElementPayload(b []byte, fam nftables.TableFamily, table, set string, elems []Element, keysOnly bool, list int) []byte {
	b = append(b, byte(fam), unix.NFNETLINK_V0, 0, 0) // nfgenmsg, res_id 0
	b = appendStringAttr(b, unix.NFTA_SET_ELEM_LIST_SET, set)
	b = appendAttr(b, unix.NFTA_SET_ELEM_LIST_SET_ID, []byte{0, 0, 0, 0})
	b = appendStringAttr(b, unix.NFTA_SET_ELEM_LIST_TABLE, table)
	b = appendAttrHeader(b, list, unix.NFTA_SET_ELEM_LIST_ELEMENTS|unix.NLA_F_NESTED)
	for i, e := range elems {
		item := valueLen(e.Key)
		withData := !keysOnly && len(e.Data) > 0
		if withData {
			item += valueLen(e.Data)
		}
		withTimeout := !keysOnly && e.Timeout > 0
		if withTimeout {
			item += nlaHeaderLen + 8
		}
		b = appendAttrHeader(b, item, uint16(i+1)|unix.NLA_F_NESTED)
		b = appendAttrHeader(b, valueLen(e.Key)-nlaHeaderLen, unix.NFTA_SET_ELEM_KEY|unix.NLA_F_NESTED)
		b = appendAttr(b, unix.NFTA_DATA_VALUE, e.Key)
		if withTimeout { // as google/nftables orders it: after the key, before the data
			b = appendAttr(b, unix.NFTA_SET_ELEM_TIMEOUT, binary.BigEndian.AppendUint64(nil, uint64(e.Timeout.Milliseconds())))
		}
		if withData {
			b = appendAttrHeader(b, valueLen(e.Data)-nlaHeaderLen, unix.NFTA_SET_ELEM_DATA|unix.NLA_F_NESTED)
			b = appendAttr(b, unix.NFTA_DATA_VALUE, e.Data)
		}
	}
	return b
}
