package nodeport

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dsproxy/dsproxy/pkg/family"
)

var (
	conflictsTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "dsproxy_nodeport_conflicts_total",
		Help: "NodePort claims that found the (protocol, port) already claimed by another Service.",
	})
	reservationsGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "dsproxy_nodeport_reservations",
		Help: "NodePorts this family rejects because their Service does not serve it.",
	}, []string{"ip_family"})
)

// MustRegister registers the package's metrics with reg; it panics if they are
// already registered there. The metrics are process-wide: with several Registries
// (tests), the reservations gauge shows the last one that changed.
func MustRegister(reg prometheus.Registerer) {
	for _, f := range family.All {
		reservationsGauge.WithLabelValues(f.Name)
	}
	reg.MustRegister(conflictsTotal, reservationsGauge)
}
