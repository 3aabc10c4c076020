// Package samplecsv reads the -samples CSV of the end-to-end benchmark
// (bench/e2e): one line per W2/W3 change and family.
package samplecsv

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// Sample is one line: proxy,services,workload,family,start,event,kernel and,
// since 2026-11-27 (stop 20), ran,waited and, since stop 23, cp_ran,cp_waited.
type Sample struct {
	Proxy, Workload, Family string
	Services                int
	// Start is the API call, Event the benchmark's own watch event, Kernel the
	// first connection that saw the change.
	Start, Event, Kernel time.Time
	// Ran and Waited are the proxy's CPU time and run-queue wait from the API
	// call until every family showed the change; HasSched is false when the
	// line has none.
	Ran, Waited time.Duration
	HasSched    bool
	// CPRan and CPWaited are the same for etcd and kube-apiserver together,
	// from the API call to the watch event; HasCPSched is false when the line
	// has none.
	CPRan, CPWaited time.Duration
	HasCPSched      bool
}

// Latency is the change's time to the kernel from the watch event, or from the
// API call.
func (s Sample) Latency(fromEvent bool) time.Duration {
	if fromEvent {
		return s.Kernel.Sub(s.Event)
	}
	return s.Kernel.Sub(s.Start)
}

// Parse reads every line of r; blank lines are skipped, anything malformed is an
// error naming its line.
func Parse(r io.Reader) ([]Sample, error) {
	var out []Sample
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		s, err := parseLine(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

// ReadFile parses the file at path; errors name it.
func ReadFile(path string) ([]Sample, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ss, err := Parse(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ss, nil
}

func parseLine(line string) (Sample, error) {
	f := strings.Split(line, ",")
	if len(f) != 7 && len(f) != 9 && len(f) != 11 {
		return Sample{}, fmt.Errorf("%d fields, want 7, 9 or 11", len(f))
	}
	s := Sample{Proxy: f[0], Workload: f[2], Family: f[3]}
	var err error
	if s.Services, err = strconv.Atoi(f[1]); err != nil {
		return Sample{}, fmt.Errorf("services: %w", err)
	}
	for i, t := range []*time.Time{&s.Start, &s.Event, &s.Kernel} {
		if *t, err = time.Parse(time.RFC3339Nano, f[4+i]); err != nil {
			return Sample{}, err
		}
	}
	if len(f) >= 9 {
		if s.HasSched, err = durations(f, 7, &s.Ran, &s.Waited); err != nil {
			return Sample{}, err
		}
	}
	if len(f) == 11 {
		if s.HasCPSched, err = durations(f, 9, &s.CPRan, &s.CPWaited); err != nil {
			return Sample{}, err
		}
	}
	return s, nil
}

// durations parses f[i] and f[i+1] (ns) into a and b; two empty fields are
// none (false).
func durations(f []string, i int, a, b *time.Duration) (bool, error) {
	if f[i] == "" && f[i+1] == "" {
		return false, nil
	}
	for j, d := range []*time.Duration{a, b} {
		ns, err := strconv.ParseInt(f[i+j], 10, 64)
		if err != nil || ns < 0 {
			return false, fmt.Errorf("field %d: %q is not a duration in ns", i+j+1, f[i+j])
		}
		*d = time.Duration(ns)
	}
	return true, nil
}
