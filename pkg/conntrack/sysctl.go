package conntrack

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Sysctls is kube-proxy's conntrack tuning (--conntrack-* flags, the "conntrack"
// section of KubeProxyConfiguration). Zero values leave the kernel's setting alone.
type Sysctls struct {
	MaxPerCore            int
	Min                   int
	TCPEstablishedTimeout time.Duration
	TCPCloseWaitTimeout   time.Duration
	TCPBeLiberal          bool
	UDPTimeout            time.Duration
	UDPStreamTimeout      time.Duration
}

// maxConntrackMax caps MaxPerCore × CPUs, as kube-proxy does.
const maxConntrackMax = 1048576

// Max returns the nf_conntrack_max kube-proxy v1.36 sets on a machine with numCPU
// CPUs, or 0 for "leave it": MaxPerCore × CPUs capped at 1048576, or Min when that
// is larger than the uncapped product (Min itself is not capped).
func (s Sysctls) Max(numCPU int) int {
	if s.MaxPerCore <= 0 {
		return 0
	}
	scaled := s.MaxPerCore * numCPU
	if scaled > maxConntrackMax {
		return maxConntrackMax
	}
	return max(scaled, s.Min)
}

// NumCPU is the machine's CPU count as kube-proxy takes it for nf_conntrack_max:
// every online CPU (sys/devices/system/cpu/online), not only those the process may
// run on (isolated CPUs, a CPU manager's shared pool); runtime.NumCPU() when that
// cannot be read.
func (fs SysFS) NumCPU() int {
	b, err := os.ReadFile(filepath.Join(fs.Sys, "devices/system/cpu/online"))
	if err != nil {
		return runtime.NumCPU()
	}
	n := 0
	for _, r := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		a, err1 := strconv.Atoi(lo)
		z := a
		var err2 error
		if isRange {
			z, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || z < a {
			return runtime.NumCPU()
		}
		n += z - a + 1
	}
	if n < 1 {
		return runtime.NumCPU()
	}
	return n
}

// SysFS names where the settings live: normally "/proc/sys" and "/sys"; tests
// point them at a temporary directory.
type SysFS struct {
	ProcSys string
	Sys     string
}

// HostSysFS is the running kernel's.
var HostSysFS = SysFS{ProcSys: "/proc/sys", Sys: "/sys"}

// Global reports whether the machine-wide settings (nf_conntrack_max and the hash
// size) can be changed from this network namespace: the kernel makes
// nf_conntrack_max read-only (mode 0444) in every namespace but the initial one,
// whoever asks. That holds in a pod whatever its PID namespace, where /proc/1 is
// the pod's own process. known is false when it cannot be told (no conntrack
// yet).
func (fs SysFS) Global() (global, known bool) {
	st, err := os.Stat(filepath.Join(fs.ProcSys, "net/netfilter/nf_conntrack_max"))
	if err != nil {
		return false, false
	}
	return st.Mode().Perm()&0o222 != 0, true
}

// NetnsOnly returns s without the machine-wide settings (nf_conntrack_max and
// the hash size): what a network namespace other than the initial one can take.
func (s Sysctls) NetnsOnly() Sysctls {
	s.MaxPerCore, s.Min = 0, 0
	return s
}

// Apply writes the settings that differ from the kernel's, and raises the
// conntrack hash size to a quarter of nf_conntrack_max when it is smaller (as
// kube-proxy does). Every setting is attempted; the error joins those that failed
// (in a network namespace other than the initial one nf_conntrack_max is
// read-only, for example).
func (s Sysctls) Apply(fs SysFS, numCPU int) error {
	var errs []error
	set := func(name string, v int) {
		if err := writeIfDifferent(filepath.Join(fs.ProcSys, "net/netfilter", name), v); err != nil {
			errs = append(errs, err)
		}
	}
	if m := s.Max(numCPU); m > 0 {
		set("nf_conntrack_max", m)
		hash := filepath.Join(fs.Sys, "module/nf_conntrack/parameters/hashsize")
		if cur, err := readInt(hash); err != nil {
			errs = append(errs, err)
		} else if cur < m/4 {
			errs = append(errs, writeInt(hash, m/4))
		}
	}
	seconds := func(name string, d time.Duration) {
		if d > 0 {
			set(name, int(d/time.Second))
		}
	}
	seconds("nf_conntrack_tcp_timeout_established", s.TCPEstablishedTimeout)
	seconds("nf_conntrack_tcp_timeout_close_wait", s.TCPCloseWaitTimeout)
	if s.TCPBeLiberal {
		set("nf_conntrack_tcp_be_liberal", 1)
	}
	seconds("nf_conntrack_udp_timeout", s.UDPTimeout)
	seconds("nf_conntrack_udp_timeout_stream", s.UDPStreamTimeout)
	return errors.Join(errs...)
}

func writeIfDifferent(path string, v int) error {
	if cur, err := readInt(path); err == nil && cur == v {
		return nil
	}
	return writeInt(path, v)
}

func readInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", path, err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", path, err)
	}
	return v, nil
}

func writeInt(path string, v int) error {
	if err := os.WriteFile(path, []byte(strconv.Itoa(v)), 0o644); err != nil {
		return fmt.Errorf("setting %s to %d: %w", path, v, err)
	}
	return nil
}
