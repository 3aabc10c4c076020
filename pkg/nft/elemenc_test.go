package nft

import (
	"bytes"
	"testing"
	"time"

	"github.com/google/nftables"
)

// TestElementEncoding checks that elementMessage encodes exactly what
// google/nftables queues for the same elements.
func TestElementEncoding(t *testing.T) {
	if !haveMessages {
		t.Fatal("google/nftables.Conn has no messages field: the direct element encoding is off")
	}
	elems := []Element{
		{Key: []byte{10, 96, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0, 1, 0, 0, 0}, Data: []byte{10, 64, 0, 1, 0x1f, 0x90, 0, 0}},
		{Key: []byte{10, 96, 0, 2, 17, 0, 0, 0, 0, 53, 0, 0, 0, 0, 0, 0}, Data: []byte{10, 64, 0, 2, 0, 53, 0, 0}},
		{Key: []byte{1, 2, 3}, Data: []byte{4, 5}}, // unaligned
		{Key: []byte{10, 96, 0, 3}},
		{Key: []byte{10, 0, 0, 9, 10, 96, 0, 4}, Data: []byte{2, 0, 0, 0}, Timeout: 10799500 * time.Millisecond}, // an affinity entry carried over
	}
	for _, keysOnly := range []bool{false, true} {
		c, err := nftables.New()
		if err != nil {
			t.Fatal(err)
		}
		tbl := &nftables.Table{Name: "dsproxy", Family: nftables.TableFamilyIPv4}
		s := &nftables.Set{Table: tbl, Name: "endpoints", HasTimeout: true}
		var ses []nftables.SetElement
		for _, e := range elems {
			se := nftables.SetElement{Key: e.Key}
			if !keysOnly {
				se.Val, se.Timeout = e.Data, e.Timeout
			}
			ses = append(ses, se)
		}
		if keysOnly {
			err = c.SetDeleteElements(s, ses)
		} else {
			err = c.SetAddElements(s, ses)
		}
		if err != nil {
			t.Fatal(err)
		}
		want := (*queuedMessages(c))[0]
		got := elementMessage(tbl.Family, tbl.Name, s.Name, elems, keysOnly)
		if got.Header != want.Header || !bytes.Equal(got.Data, want.Data) {
			t.Errorf("keysOnly=%v:\n got  %+v %x\n want %+v %x", keysOnly, got.Header, got.Data, want.Header, want.Data)
		}
	}
}
