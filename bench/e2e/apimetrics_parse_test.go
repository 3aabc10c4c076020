//go:build e2e && netns

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestParseAPIW3Metrics reads the histograms W3 takes from the API server's
// /metrics, in its text format, and the mean between two readings.
func TestParseAPIW3Metrics(t *testing.T) {
	const head = `# HELP apiserver_request_duration_seconds [STABLE] Response latency distribution in seconds for each verb, dry run value, group, version, resource, subresource, scope and component.
# TYPE apiserver_request_duration_seconds histogram
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="services",scope="resource",subresource="",verb="POST",version="v1",le="+Inf"} %[1]s
apiserver_request_duration_seconds_sum{component="apiserver",dry_run="",group="",resource="services",scope="resource",subresource="",verb="POST",version="v1"} %[2]s
apiserver_request_duration_seconds_count{component="apiserver",dry_run="",group="",resource="services",scope="resource",subresource="",verb="POST",version="v1"} %[1]s
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="services",scope="resource",subresource="",verb="GET",version="v1",le="+Inf"} 7
apiserver_request_duration_seconds_sum{component="apiserver",dry_run="",group="",resource="services",scope="resource",subresource="",verb="GET",version="v1"} 70
apiserver_request_duration_seconds_count{component="apiserver",dry_run="",group="",resource="services",scope="resource",subresource="",verb="GET",version="v1"} 7
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="services",scope="resource",subresource="status",verb="POST",version="v1",le="+Inf"} 5
apiserver_request_duration_seconds_sum{component="apiserver",dry_run="",group="",resource="services",scope="resource",subresource="status",verb="POST",version="v1"} 50
apiserver_request_duration_seconds_count{component="apiserver",dry_run="",group="",resource="services",scope="resource",subresource="status",verb="POST",version="v1"} 5
`
	const alloc = `# HELP kube_apiserver_clusterip_allocator_allocation_duration_seconds [ALPHA] Duration in seconds to allocate a Cluster IP by ServiceCIDR
# TYPE kube_apiserver_clusterip_allocator_allocation_duration_seconds histogram
kube_apiserver_clusterip_allocator_allocation_duration_seconds_bucket{cidr="10.96.0.0/16",le="+Inf"} %[1]s
kube_apiserver_clusterip_allocator_allocation_duration_seconds_sum{cidr="10.96.0.0/16"} %[2]s
kube_apiserver_clusterip_allocator_allocation_duration_seconds_count{cidr="10.96.0.0/16"} %[1]s
kube_apiserver_clusterip_allocator_allocation_duration_seconds_bucket{cidr="fd00:96::/112",le="+Inf"} %[1]s
kube_apiserver_clusterip_allocator_allocation_duration_seconds_sum{cidr="fd00:96::/112"} %[3]s
kube_apiserver_clusterip_allocator_allocation_duration_seconds_count{cidr="fd00:96::/112"} %[1]s
`
	const del = `apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="services",scope="resource",subresource="",verb="DELETE",version="v1",le="+Inf"} %[1]s
apiserver_request_duration_seconds_sum{component="apiserver",dry_run="",group="",resource="services",scope="resource",subresource="",verb="DELETE",version="v1"} %[2]s
apiserver_request_duration_seconds_count{component="apiserver",dry_run="",group="",resource="services",scope="resource",subresource="",verb="DELETE",version="v1"} %[1]s
`
	text := func(posts, postSum, allocs, sum4, sum6, dels, delSum string) []byte {
		s := fmt.Sprintf(head, posts, postSum)
		if dels != "" {
			s += fmt.Sprintf(del, dels, delSum)
		}
		return []byte(s + fmt.Sprintf(alloc, allocs, sum4, sum6))
	}
	// Before any DELETE: none counted, no error.
	a, err := parseAPIW3Metrics(text("10", "1", "10", "0.2", "0.3", "", ""), false)
	if err != nil {
		t.Fatal(err)
	}
	if a.post != (apiHist{1, 10}) || a.alloc != (apiHist{0.5, 20}) || a.del != (apiHist{}) {
		t.Fatalf("parsed %+v, want POST {1 10}, allocations {0.5 20} and no DELETE", a)
	}
	// 20 more POSTs took 0.6 s; 40 more allocations 0.4 s; 20 DELETEs 1 s.
	b, err := parseAPIW3Metrics(text("30", "1.6", "30", "0.4", "0.5", "20", "1"), false)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := a.post.mean(b.post), 30*time.Millisecond; got != want {
		t.Errorf("POST mean = %v, want %v", got, want)
	}
	if got, want := a.del.mean(b.del), 50*time.Millisecond; got != want {
		t.Errorf("DELETE mean = %v, want %v", got, want)
	}
	if got, want := a.alloc.mean(b.alloc), 10*time.Millisecond; got != want {
		t.Errorf("allocation mean = %v, want %v", got, want)
	}
	if got := a.alloc.mean(a.alloc); got != 0 {
		t.Errorf("mean without observations = %v, want 0", got)
	}
	// Without the allocator's histogram (another allocator), or any Service
	// POST yet: an error naming what is missing.
	if _, err := parseAPIW3Metrics([]byte(fmt.Sprintf(head, "1", "1")), false); err == nil || !strings.Contains(err.Error(), metricAllocDuration) {
		t.Errorf("no allocator histogram: err = %v", err)
	}
	if _, err := parseAPIW3Metrics([]byte(fmt.Sprintf(alloc, "1", "1", "1")), false); err == nil || !strings.Contains(err.Error(), "POST services") {
		t.Errorf("no POST histogram: err = %v", err)
	}
	if _, err := parseAPIW3Metrics([]byte("not metrics {"), false); err == nil {
		t.Error("garbage: no error")
	}
	// Before W3, an API server that has created no Service since it started
	// has neither series: zero, no error; garbage is still an error.
	z, err := parseAPIW3Metrics([]byte("# nothing yet\n"), true)
	if err != nil || z != (apiW3Metrics{}) {
		t.Errorf("before W3, no series: %+v, %v; want zero, no error", z, err)
	}
	if _, err := parseAPIW3Metrics([]byte("not metrics {"), true); err == nil {
		t.Error("garbage before W3: no error")
	}
	if _, err := parseAPIW3Metrics([]byte("# nothing yet\n"), false); err == nil {
		t.Error("after W3, no series: no error")
	}
}
