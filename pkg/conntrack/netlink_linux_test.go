//go:build linux

package conntrack

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/dsproxy/dsproxy/internal/testaddr"
	"github.com/dsproxy/dsproxy/pkg/family"
)

// ctMessage builds a ctnetlink message as the kernel dumps it.
func ctMessage(proto Protocol, orig, reply [2]netip.AddrPort, extra ...*nl.RtAttr) []byte {
	tuple := func(typ int, t [2]netip.AddrPort) *nl.RtAttr {
		a := nl.NewRtAttr(typ|unix.NLA_F_NESTED, nil)
		ip := a.AddRtAttr(ctaTupleIP|unix.NLA_F_NESTED, nil)
		if t[0].Addr().Is4() {
			ip.AddRtAttr(ctaIPv4Src, t[0].Addr().AsSlice())
			ip.AddRtAttr(ctaIPv4Dst, t[1].Addr().AsSlice())
		} else {
			ip.AddRtAttr(ctaIPv6Src, t[0].Addr().AsSlice())
			ip.AddRtAttr(ctaIPv6Dst, t[1].Addr().AsSlice())
		}
		p := a.AddRtAttr(ctaTupleProto|unix.NLA_F_NESTED, nil)
		p.AddRtAttr(ctaProtoNum, []byte{byte(proto)})
		p.AddRtAttr(ctaProtoSrcPort, nl.BEUint16Attr(t[0].Port()))
		p.AddRtAttr(ctaProtoDstPort, nl.BEUint16Attr(t[1].Port()))
		return a
	}
	msg := []byte{unix.AF_INET, 0, 0, 0} // nfgenmsg
	// Attributes the parser skips: status, timeout, protoinfo.
	msg = append(msg, nl.NewRtAttr(3, nl.BEUint32Attr(0x18e)).Serialize()...)
	msg = append(msg, tuple(ctaTupleOrig, orig).Serialize()...)
	msg = append(msg, nl.NewRtAttr(7, nl.BEUint32Attr(30)).Serialize()...)
	msg = append(msg, tuple(ctaTupleReply, reply).Serialize()...)
	for _, a := range extra {
		msg = append(msg, a.Serialize()...)
	}
	return msg
}

func TestParseFlow(t *testing.T) {
	for _, f := range family.All {
		for _, proto := range []Protocol{UDP, SCTP, TCP} {
			cli := netip.AddrPortFrom(testaddr.Client(f, 1), 40001)
			svc := netip.AddrPortFrom(testaddr.Svc(f, 1), 80)
			ep := netip.AddrPortFrom(testaddr.Pod(f, 1), 8080)
			msg := ctMessage(proto, [2]netip.AddrPort{cli, svc}, [2]netip.AddrPort{ep, cli},
				nl.NewRtAttr(ctaMark, nl.BEUint32Attr(0x4000)), nl.NewRtAttr(ctaZone, nl.BEUint16Attr(7)))
			got, err := parseFlow(msg)
			if err != nil {
				t.Fatalf("%s %s: %v", f, proto, err)
			}
			want := Flow{Protocol: proto, OrigSrc: cli, OrigDst: svc, ReplySrc: ep, ReplyDst: cli, Mark: 0x4000, Zone: 7}
			if got != want {
				t.Errorf("%s %s: got %v %+v, want %+v", f, proto, got, got, want)
			}
			if got.Family() != f {
				t.Errorf("family %v", got.Family())
			}
			// Truncations never panic and never yield a flow with a missing tuple.
			for i := range len(msg) {
				if fl, err := parseFlow(msg[:i]); err == nil && (!fl.OrigDst.IsValid() || !fl.ReplySrc.IsValid()) {
					t.Fatalf("truncated at %d: parsed %v", i, fl)
				}
			}
		}
	}
}

func TestParseFlowErrors(t *testing.T) {
	cli := netip.MustParseAddrPort("198.51.100.1:1")
	svc := netip.MustParseAddrPort("10.96.0.1:2")
	good := ctMessage(UDP, [2]netip.AddrPort{cli, svc}, [2]netip.AddrPort{svc, cli})
	for name, msg := range map[string][]byte{
		"short":      {2, 0},
		"bad length": append(append([]byte(nil), good[:4]...), 0xff, 0x00, 1, 0),
		"no tuples":  {2, 0, 0, 0},
	} {
		if _, err := parseFlow(msg); err == nil || !strings.Contains(err.Error(), "conntrack") {
			t.Errorf("%s: err %v", name, err)
		}
	}
}
