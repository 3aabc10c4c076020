//go:build e2e && netns

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"
)

// apiHist is the sum and count of one of the API server's histograms,
// summed over the series it selects.
type apiHist struct{ sum, count float64 }

// apiW3Metrics are the API server's figures for W3's Services: every POST
// and every DELETE of a Service (the whole request: a DELETE's includes
// releasing the ClusterIPs, after the Service is gone from storage), and
// every ClusterIP allocation (one per family and Service, inside the POST).
type apiW3Metrics struct {
	post, del, alloc apiHist
}

const (
	metricRequestDuration = "apiserver_request_duration_seconds"
	metricAllocDuration   = "kube_apiserver_clusterip_allocator_allocation_duration_seconds"
)

// readAPIW3Metrics reads the API server's /metrics; before is the reading
// before W3 (see parseAPIW3Metrics).
func readAPIW3Metrics(ctx context.Context, client kubernetes.Interface, before bool) (apiW3Metrics, error) {
	raw, err := client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return apiW3Metrics{}, fmt.Errorf("API server metrics: %w", err)
	}
	return parseAPIW3Metrics(raw, before)
}

// parseAPIW3Metrics parses the histograms. Without a series of Service POSTs
// or of ClusterIP allocations it fails, but for the reading before W3: an API
// server that has not created a Service since it started (restarted after
// -load=etcd) has none yet, which counts as zero.
func parseAPIW3Metrics(raw []byte, before bool) (apiW3Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		return apiW3Metrics{}, fmt.Errorf("API server metrics: %w", err)
	}
	var m apiW3Metrics
	var found [2]bool
	m.post, found[0] = histSum(fams[metricRequestDuration], map[string]string{"verb": "POST", "resource": "services", "subresource": ""})
	// No DELETE yet is no error: the first W3 reading comes before any.
	m.del, _ = histSum(fams[metricRequestDuration], map[string]string{"verb": "DELETE", "resource": "services", "subresource": ""})
	m.alloc, found[1] = histSum(fams[metricAllocDuration], nil)
	switch {
	case before:
	case !found[0]:
		return m, fmt.Errorf("API server metrics: no %s for POST services", metricRequestDuration)
	case !found[1]:
		return m, fmt.Errorf("API server metrics: no %s", metricAllocDuration)
	}
	return m, nil
}

// histSum sums the histograms of f whose labels include want (a label absent
// from a series counts as ""). found is false when f is not a histogram
// family or no series matched.
func histSum(f *dto.MetricFamily, want map[string]string) (h apiHist, found bool) {
	if f == nil || f.GetType() != dto.MetricType_HISTOGRAM {
		return h, false
	}
	for _, s := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range s.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			if labels[k] != v {
				match = false
				break
			}
		}
		if match {
			h.sum += s.GetHistogram().GetSampleSum()
			h.count += float64(s.GetHistogram().GetSampleCount())
			found = true
		}
	}
	return h, found
}

// mean is the mean of the observations between a and b (b later), 0 when
// there were none.
func (a apiHist) mean(b apiHist) time.Duration {
	if n := b.count - a.count; n > 0 {
		return time.Duration((b.sum - a.sum) / n * float64(time.Second))
	}
	return 0
}
