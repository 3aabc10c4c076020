package metaproxier

import (
	"bytes"
	"flag"
	"os"
	"strings"
	"testing"

	discovery "k8s.io/api/discovery/v1"
	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// setKlog sets klog's flags for one test and puts back the values they had
// after it.
func setKlog(t *testing.T, kv ...string) {
	t.Helper()
	var fs flag.FlagSet
	klog.InitFlags(&fs)
	prev := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		prev[kv[i]] = fs.Lookup(kv[i]).Value.String()
		if err := fs.Set(kv[i], kv[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		klog.Flush()
		for k, v := range prev {
			_ = fs.Set(k, v)
		}
		klog.SetOutput(os.Stderr)
	})
}

// TestHandlersLogEachCallAtV4: with -v=4 every event is logged as it reaches the
// proxy, in kube-proxy's words, so that a log lines events up with the syncs that
// follow them (bench/e2e); below V(4) nothing is.
func TestHandlersLogEachCallAtV4(t *testing.T) {
	deliver := func(m *MetaProxier) {
		s := svc("web")
		s.Namespace = "shop"
		m.OnServiceAdd(s)
		m.OnServiceUpdate(s, s)
		m.OnServiceDelete(s)
		m.OnNodeAdd(node("n1"))
		m.OnNodeUpdate(node("n1"), node("n1"))
		m.OnNodeDelete(node("n1"))
		es := slice("web-abc", discovery.AddressTypeIPv6)
		m.OnEndpointSliceAdd(es)
		m.OnEndpointSliceUpdate(es, es)
		m.OnEndpointSliceDelete(es)
	}
	for _, v := range []string{"3", "4"} {
		t.Run("v="+v, func(t *testing.T) {
			var buf bytes.Buffer
			setKlog(t, "v", v, "logtostderr", "false", "alsologtostderr", "false", "skip_headers", "true")
			klog.SetOutput(&buf)
			m, _ := setup(t, family.IPv4, family.IPv6)
			deliver(m)
			klog.Flush()
			want := []string{
				`"Calling handler.OnServiceAdd" service="shop/web"`,
				`"Calling handler.OnServiceUpdate" service="shop/web"`,
				`"Calling handler.OnServiceDelete" service="shop/web"`,
				`"Calling handler.OnNodeAdd" node="n1"`,
				`"Calling handler.OnNodeUpdate" node="n1"`,
				`"Calling handler.OnNodeDelete" node="n1"`,
				`"Calling handler.OnEndpointSliceAdd" endpointSlice="web-abc"`,
				`"Calling handler.OnEndpointSliceUpdate" endpointSlice="web-abc"`,
				`"Calling handler.OnEndpointSliceDelete" endpointSlice="web-abc"`,
			}
			got := buf.String()
			for _, w := range want {
				if v == "4" && !strings.Contains(got, w) {
					t.Errorf("log lacks %s:\n%s", w, got)
				}
			}
			if v == "3" && strings.Contains(got, "Calling handler") {
				t.Errorf("logged at -v=3:\n%s", got)
			}
		})
	}
}
