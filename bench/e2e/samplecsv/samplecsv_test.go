package samplecsv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	in := strings.Join([]string{
		"dsproxy/nftables,10000,W3 service delete,IPv4,2026-11-27T10:05:08.000000000Z,2026-11-27T10:05:08.004000000Z,2026-11-27T10:05:08.010000000Z",
		"",
		"kube-proxy/nftables,30000,W2 endpoint change,IPv6,2026-11-27T10:05:09.000000000Z,2026-11-27T10:05:09.001000000Z,2026-11-27T10:05:09.002000000Z,1700000,1300000",
		"dsproxy/nftables,30000,W2 endpoint change,IPv6,2026-11-27T10:05:09.000000000Z,2026-11-27T10:05:09.001000000Z,2026-11-27T10:05:09.002000000Z,,",
		"dsproxy/nftables,30000,W3 service add,IPv4,2026-11-27T10:05:09.000000000Z,2026-11-27T10:05:09.001000000Z,2026-11-27T10:05:09.002000000Z,,,3000000,9000000",
		"dsproxy/nftables,30000,W3 service add,IPv6,2026-11-27T10:05:09.000000000Z,2026-11-27T10:05:09.001000000Z,2026-11-27T10:05:09.002000000Z,1,2,,",
	}, "\n")
	got, err := Parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 5 {
		t.Fatalf("%d samples, want 5", len(got))
	}
	if s := got[0]; s.Proxy != "dsproxy/nftables" || s.Services != 10000 || s.Workload != "W3 service delete" ||
		s.Family != "IPv4" || s.HasSched || s.Latency(true) != 6*time.Millisecond || s.Latency(false) != 10*time.Millisecond {
		t.Errorf("first sample: %+v", s)
	}
	if s := got[1]; !s.HasSched || s.Ran != 1700*time.Microsecond || s.Waited != 1300*time.Microsecond || s.Services != 30000 {
		t.Errorf("second sample: %+v", s)
	}
	if got[2].HasSched || got[2].HasCPSched {
		t.Errorf("third sample has empty ran,waited but HasSched: %+v", got[2])
	}
	if s := got[3]; s.HasSched || !s.HasCPSched || s.CPRan != 3*time.Millisecond || s.CPWaited != 9*time.Millisecond {
		t.Errorf("fourth sample: %+v, want the control plane's ran 3 ms, waited 9 ms, no proxy's", s)
	}
	if s := got[4]; !s.HasSched || s.Ran != 1 || s.Waited != 2 || s.HasCPSched {
		t.Errorf("fifth sample: %+v, want the proxy's ran 1 ns, waited 2 ns, no control plane's", s)
	}
	for _, bad := range []string{
		"a,b,c",
		"p,1,W,IPv4,2026-11-27T10:05:08Z,2026-11-27T10:05:08Z,2026-11-27T10:05:08Z,17",
		"p,1,W,IPv4,yesterday,2026-11-27T10:05:08Z,2026-11-27T10:05:08Z",
		"p,many,W,IPv4,2026-11-27T10:05:08Z,2026-11-27T10:05:08Z,2026-11-27T10:05:08Z",
		"p,1,W,IPv4,2026-11-27T10:05:08Z,2026-11-27T10:05:08Z,2026-11-27T10:05:08Z,-1,2",
		"p,1,W,IPv4,2026-11-27T10:05:08Z,2026-11-27T10:05:08Z,2026-11-27T10:05:08Z,1,2,3",
		"p,1,W,IPv4,2026-11-27T10:05:08Z,2026-11-27T10:05:08Z,2026-11-27T10:05:08Z,1,2,3,x",
		"p,1,W,IPv4,2026-11-27T10:05:08Z,2026-11-27T10:05:08Z,2026-11-27T10:05:08Z,,,5,",
	} {
		if _, err := Parse(strings.NewReader("\n" + bad + "\n")); err == nil || !strings.HasPrefix(err.Error(), "line 2:") {
			t.Errorf("Parse(%q): %v, want an error naming line 2", bad, err)
		}
	}
}

func TestReadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "samples.csv")
	if _, err := ReadFile(path); err == nil {
		t.Error("ReadFile of a missing file: no error")
	}
	if err := os.WriteFile(path, []byte("a,b,c\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(path); err == nil || !strings.Contains(err.Error(), path+": line 1:") {
		t.Errorf("ReadFile of a bad file: %v, want an error naming the file and line", err)
	}
	line := "p,1,W,IPv4,2026-11-27T10:05:08Z,2026-11-27T10:05:08Z,2026-11-27T10:05:08.001Z\n"
	if err := os.WriteFile(path, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	if ss, err := ReadFile(path); err != nil || len(ss) != 1 || ss[0].Latency(true) != time.Millisecond {
		t.Errorf("ReadFile = %+v, %v", ss, err)
	}
}
