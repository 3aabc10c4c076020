package metrics

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"sort"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// These helpers do what prometheus/testutil's CollectAndCompare, CollectAndCount
// and ToFloat64 do. testutil itself imports github.com/kylelemons/godebug, which
// go.mod does not list, so using it would need a go.mod change.

// collectAndCompare collects c and compares the families named in names (all if
// none) with expected, in the text exposition format.
func collectAndCompare(c prometheus.Collector, expected io.Reader, names ...string) error {
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		return fmt.Errorf("registering collector: %w", err)
	}
	got, err := reg.Gather()
	if err != nil {
		return fmt.Errorf("gathering: %w", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	wantMap, err := parser.TextToMetricFamilies(expected)
	if err != nil {
		return fmt.Errorf("parsing expected: %w", err)
	}
	var want []*dto.MetricFamily
	for _, mf := range wantMap {
		want = append(want, mf)
	}
	sort.Slice(want, func(i, j int) bool { return want[i].GetName() < want[j].GetName() })
	g, w := text(got, names), text(want, names)
	if g != w {
		return fmt.Errorf("metrics differ:\n--- got\n%s\n--- want\n%s", g, w)
	}
	return nil
}

func text(mfs []*dto.MetricFamily, names []string) string {
	var buf bytes.Buffer
	for _, mf := range mfs {
		if len(names) > 0 && !slices.Contains(names, mf.GetName()) {
			continue
		}
		if _, err := expfmt.MetricFamilyToText(&buf, mf); err != nil {
			return err.Error()
		}
	}
	return buf.String()
}

// collectAndCount counts the series c exports.
func collectAndCount(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric)
	go func() {
		c.Collect(ch)
		close(ch)
	}()
	n := 0
	for range ch {
		n++
	}
	return n
}

// toFloat64 returns the value of a collector exporting exactly one gauge or counter.
func toFloat64(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 1)
	go func() {
		c.Collect(ch)
		close(ch)
	}()
	var ms []prometheus.Metric
	for m := range ch {
		ms = append(ms, m)
	}
	if len(ms) != 1 {
		panic(fmt.Sprintf("collected %d metrics, want 1", len(ms)))
	}
	var pb dto.Metric
	if err := ms[0].Write(&pb); err != nil {
		panic(err)
	}
	switch {
	case pb.Gauge != nil:
		return pb.Gauge.GetValue()
	case pb.Counter != nil:
		return pb.Counter.GetValue()
	}
	panic("not a gauge or counter")
}
