package metrics

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/nfacct"
)

// NFAcctReader reads nfacct counters (nfacct.Netlink).
type NFAcctReader interface {
	Get(name string) (nfacct.Counter, error)
}

// nfacctMetrics are kube-proxy's iptables-mode metrics read from nfacct counters
// at each scrape.
var nfacctMetrics = []struct {
	counter string
	desc    *prometheus.Desc
}{
	{nfacct.CTStateInvalidDropped, prometheus.NewDesc("kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
		"packets dropped by iptables to work around conntrack problems", nil, nil)},
	{nfacct.LocalhostNodePortsAccepted, prometheus.NewDesc("kubeproxy_iptables_localhost_nodeports_accepted_packets_total",
		"Number of packets accepted on nodeports of loopback interface", nil, nil)},
}

// nfacctCollector exports the nfacct-backed metrics.
type nfacctCollector struct{ r NFAcctReader }

// NewNFAcctCollector returns the collector of kube-proxy's two nfacct-backed
// iptables-mode metrics, kubeproxy_iptables_ct_state_invalid_dropped_packets_total
// and kubeproxy_iptables_localhost_nodeports_accepted_packets_total, read from r
// at each scrape. As in kube-proxy, a counter that cannot be read (not created
// yet, or no nfnetlink_acct in the kernel) has no sample.
func NewNFAcctCollector(r NFAcctReader) prometheus.Collector { return nfacctCollector{r} }

// Describe implements prometheus.Collector.
func (c nfacctCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range nfacctMetrics {
		ch <- m.desc
	}
}

// Collect implements prometheus.Collector.
func (c nfacctCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range nfacctMetrics {
		ctr, err := c.r.Get(m.counter)
		if err != nil {
			if !errors.Is(err, nfacct.ErrNotFound) {
				klog.V(2).ErrorS(err, "Reading an nfacct counter", "counter", m.counter)
			}
			continue
		}
		ch <- prometheus.MustNewConstMetric(m.desc, prometheus.CounterValue, float64(ctr.Packets))
	}
}
