package conntrack

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

func fakeSysFS(t *testing.T, values map[string]string) SysFS {
	t.Helper()
	root := t.TempDir()
	fs := SysFS{ProcSys: filepath.Join(root, "proc"), Sys: filepath.Join(root, "sys")}
	for name, v := range values {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return fs
}

func read(t *testing.T, fs SysFS, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(filepath.Dir(fs.ProcSys), rel))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestSysctlsMax(t *testing.T) {
	cases := []struct {
		s    Sysctls
		cpus int
		want int
	}{
		{Sysctls{}, 4, 0},
		{Sysctls{MaxPerCore: 32768, Min: 131072}, 2, 131072},
		{Sysctls{MaxPerCore: 32768, Min: 131072}, 8, 262144},
		{Sysctls{MaxPerCore: 1 << 20}, 64, maxConntrackMax},
		// As kube-proxy v1.36: a min above the cap is kept, unless the
		// per-core product is capped.
		{Sysctls{MaxPerCore: 32768, Min: 2000000}, 4, 2000000},
		{Sysctls{MaxPerCore: 32768, Min: 2000000}, 64, maxConntrackMax},
	}
	for _, c := range cases {
		if got := c.s.Max(c.cpus); got != c.want {
			t.Errorf("%+v on %d CPUs: %d, want %d", c.s, c.cpus, got, c.want)
		}
	}
}

// NumCPU counts the machine's online CPUs, not the process's affinity.
func TestNumCPU(t *testing.T) {
	for online, want := range map[string]int{"0-63": 64, "0": 1, "0-3,8-11,16": 9} {
		fs := fakeSysFS(t, map[string]string{"sys/devices/system/cpu/online": online})
		if got := fs.NumCPU(); got != want {
			t.Errorf("online %q: %d CPUs, want %d", online, got, want)
		}
	}
	if got := (SysFS{Sys: t.TempDir()}).NumCPU(); got != runtime.NumCPU() {
		t.Errorf("no online file: %d, want runtime.NumCPU() %d", got, runtime.NumCPU())
	}
}

func TestSysctlsApply(t *testing.T) {
	fs := fakeSysFS(t, map[string]string{
		"proc/net/netfilter/nf_conntrack_max":                     "65536",
		"proc/net/netfilter/nf_conntrack_tcp_timeout_established": "432000",
		"proc/net/netfilter/nf_conntrack_tcp_timeout_close_wait":  "60",
		"proc/net/netfilter/nf_conntrack_tcp_be_liberal":          "0",
		"proc/net/netfilter/nf_conntrack_udp_timeout":             "30",
		"proc/net/netfilter/nf_conntrack_udp_timeout_stream":      "120",
		"sys/module/nf_conntrack/parameters/hashsize":             "16384",
	})
	s := Sysctls{MaxPerCore: 32768, Min: 131072, TCPEstablishedTimeout: 24 * time.Hour,
		TCPCloseWaitTimeout: time.Hour, TCPBeLiberal: true, UDPTimeout: 10 * time.Second}
	if err := s.Apply(fs, 2); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"proc/net/netfilter/nf_conntrack_max":                     "131072",
		"proc/net/netfilter/nf_conntrack_tcp_timeout_established": "86400",
		"proc/net/netfilter/nf_conntrack_tcp_timeout_close_wait":  "3600",
		"proc/net/netfilter/nf_conntrack_tcp_be_liberal":          "1",
		"proc/net/netfilter/nf_conntrack_udp_timeout":             "10",
		"proc/net/netfilter/nf_conntrack_udp_timeout_stream":      "120", // zero setting: left alone
		"sys/module/nf_conntrack/parameters/hashsize":             "32768",
	}
	for rel, v := range want {
		if got := read(t, fs, rel); got != v {
			t.Errorf("%s = %s, want %s", rel, got, v)
		}
	}
}

func TestSysctlsApplyReportsEveryFailure(t *testing.T) {
	fs := fakeSysFS(t, map[string]string{"proc/net/netfilter/nf_conntrack_udp_timeout": "30"})
	// A directory where a setting should be: reads and writes fail, as for a
	// read-only sysctl.
	if err := os.MkdirAll(filepath.Join(fs.ProcSys, "net/netfilter/nf_conntrack_tcp_be_liberal"), 0o755); err != nil {
		t.Fatal(err)
	}
	s := Sysctls{MaxPerCore: 10, TCPBeLiberal: true, UDPTimeout: 5 * time.Second}
	err := s.Apply(fs, 1)
	if err == nil || !strings.Contains(err.Error(), "nf_conntrack_tcp_be_liberal") || !strings.Contains(err.Error(), "hashsize") {
		t.Fatalf("err = %v", err)
	}
	if got := read(t, fs, "proc/net/netfilter/nf_conntrack_udp_timeout"); got != "5" {
		t.Fatalf("a failure stopped the other settings: udp timeout %s", got)
	}
}

// Global tells the initial network namespace (nf_conntrack_max writable) from
// the others (read-only there, as the kernel makes it).
func TestSysFSGlobal(t *testing.T) {
	fs := fakeSysFS(t, map[string]string{"proc/net/netfilter/nf_conntrack_max": "131072"})
	if g, known := fs.Global(); !g || !known {
		t.Errorf("writable nf_conntrack_max: Global() = %v, %v, want true, true", g, known)
	}
	if err := os.Chmod(filepath.Join(fs.ProcSys, "net/netfilter/nf_conntrack_max"), 0o444); err != nil {
		t.Fatal(err)
	}
	if g, known := fs.Global(); g || !known {
		t.Errorf("read-only nf_conntrack_max: Global() = %v, %v, want false, true", g, known)
	}
	if _, known := fakeSysFS(t, nil).Global(); known {
		t.Error("no nf_conntrack_max: Global() known")
	}
	s := Sysctls{MaxPerCore: 32768, Min: 131072, TCPEstablishedTimeout: time.Hour}.NetnsOnly()
	if s.Max(4) != 0 || s.TCPEstablishedTimeout != time.Hour {
		t.Errorf("NetnsOnly: %+v", s)
	}
}
