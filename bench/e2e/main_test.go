//go:build e2e && netns

// Package e2e measures dsproxy and kube-proxy v1.36 end to end on the same
// workload, in the same run, on the same machine (issue 5).
//
// One real control plane (hack/controlplane: etcd, kube-apiserver,
// kube-controller-manager) holds N dual-stack Services without selectors, each
// with one hand-made EndpointSlice per family (bench.Workload). Each proxy then
// runs alone as a process in a fresh node network namespace linked to the
// control plane, and every figure is observed from outside the proxy: real TCP
// connections from a client pod namespace through the node to ClusterIPs whose
// endpoints are real servers in pod namespaces.
//
//	go test -tags e2e,netns -run TestBenchE2E -v -timeout 60m ./bench/e2e/ -args -services=1000
//
// See bench/README.md ("End to end") for the method and the figures.
package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dsproxy/dsproxy/test/e2e/framework"
)

var (
	flagServices  = flag.String("services", "1000", "comma-separated numbers of dual-stack Services (ascending; the load grows between sizes)")
	flagProxies   = flag.String("proxies", "dsproxy,kube-proxy/nftables,kube-proxy/iptables,kube-proxy/iptables-legacy", "comma-separated proxies to measure: dsproxy (nftables mode), dsproxy/iptables (the iptables on PATH), kube-proxy/nftables, kube-proxy/iptables (iptables-nft, the iptables on PATH), kube-proxy/iptables-legacy (iptables mode with the iptables-legacy binaries)")
	flagW1Starts  = flag.Int("w1-starts", 1, "W1: cold starts per proxy and size, each after the proxy's --cleanup removed the previous start's rules; the row gives their p50 and max (CPU and RSS: the first start's)")
	flagChanges   = flag.Int("changes", 50, "W2: endpoint changes (alternating IPv4 and IPv6)")
	flagPairs     = flag.Int("pairs", 10, "W3: Service create+delete pairs")
	flagKPChanges = flag.Int("kube-proxy-changes", 0, "W2: cap of kube-proxy's endpoint changes (0: as -changes)")
	flagKPPairs   = flag.Int("kube-proxy-pairs", 0, "W3: cap of kube-proxy's Service pairs (0: as -pairs)")
	flagConnects  = flag.Int("connects", 500, "W4: measured TCP connects per target")
	flagTimeout   = flag.Duration("workload-timeout", 3*time.Minute, "W1 cap (process start → programmed); beyond it the row says \"not finished after T\"")
	flagChangeTO  = flag.Duration("change-timeout", time.Minute, "W2/W3 cap of each single change")
	flagGap       = flag.Duration("gap", 1100*time.Millisecond, "W2/W3: pause after each observed change (kube-proxy's minSyncPeriod is 1s)")
	flagWorkers   = flag.Int("workers", 32, "load generator: concurrent API writers")
	flagLoad      = flag.String("load", "api", "load generator: \"api\" creates the load's Services and EndpointSlices through the API server; \"etcd\" writes them (with their IPAddresses and NodePorts) straight into etcd as the API server stores them, in seconds rather than the hour 30k take through a v1.36 API server's ClusterIP allocator here (the probe and W3's Services are created through the API server either way)")
	flagOut       = flag.String("out", "out", "directory for results.json, results.txt and results.png")
	flagMerge     = flag.String("merge", "", "results.json of earlier runs, comma-separated: their rows for sizes not measured now (nor merged from an earlier path) are added to the table, JSON and plot (marked in the status)")
	flagDSArgs    = flag.String("dsproxy-args", "", "extra dsproxy arguments, space-separated (e.g. \"-v=2\" to log every sync)")
	flagDSEnv     = flag.String("dsproxy-env", "", "extra environment for dsproxy, space-separated KEY=VALUE (e.g. \"GOMAXPROCS=1\")")
	flagProfiles  = flag.String("profiles", "", "directory for a heap profile of dsproxy once programmed (W1), per size; runs dsproxy with --profiling")
	flagRulesets  = flag.String("rulesets", "", "a directory: after W1, each proxy's node ruleset (nft list ruleset) is saved there as ruleset-<proxy>-<mode>-<services>.nft")
	flagEtcd      = flag.String("etcd", "kubernetes", "etcd of the control plane: \"kubernetes\" (the version Kubernetes v1.36 requires, built by hack/controlplane/build-etcd.sh; informers stream their initial list as in real clusters) or \"debian\" (etcd-server from PATH, 3.4: no streaming lists, informers LIST)")
	flagBin       = flag.String("dsproxy-bin", "", "prebuilt dsproxy binary (default: go build ./cmd/dsproxy)")
	flagSpread    = flag.Int("count-spread", 0, "endpoints per family: 0 gives every Service 10; K (2 … 64) gives Service i 1+i%K and the real ones (W1's and W4's targets) K, so that W4's ClusterIP is in the last of K endpoint-count groups (needs K server pods per node)")
	flagRender    = flag.String("render", "", "TestRender: an earlier results.json to write again with this version's report (ratios, targets, plot) into -out, measuring nothing")
	flagCPCPU     = flag.String("control-plane-cpu", "shared", "\"shared\": etcd, kube-apiserver and kube-controller-manager compete for the CPUs with the node side (proxy, pods, probe) as equals; \"background\": they get the least CPU weight of a cgroup and run on what the node side leaves, as if on machines of their own")
	flagSettle    = flag.Duration("settle", 90*time.Second, "before the no-proxy baseline, before W2 and before W4: wait up to this long for the machine to go quiet (0: do not wait)")
)

func TestMain(m *testing.M) { framework.Main(m) }

// proxySpec is one proxy under test.
type proxySpec struct {
	Name string // dsproxy | kube-proxy
	Mode string // nftables | iptables
}

func (p proxySpec) String() string { return p.Name + "/" + p.Mode }

func parseProxies(s string) ([]proxySpec, error) {
	var out []proxySpec
	for _, f := range strings.Split(s, ",") {
		switch strings.TrimSpace(f) {
		case "dsproxy", "dsproxy/nftables":
			out = append(out, proxySpec{"dsproxy", "nftables"})
		case "dsproxy/iptables":
			out = append(out, proxySpec{"dsproxy", "iptables"})
		case "kube-proxy/nftables":
			out = append(out, proxySpec{"kube-proxy", "nftables"})
		case "kube-proxy/iptables":
			out = append(out, proxySpec{"kube-proxy", "iptables"})
		case "kube-proxy/iptables-legacy":
			out = append(out, proxySpec{"kube-proxy", "iptables-legacy"})
		case "":
		default:
			return nil, fmt.Errorf("unknown proxy %q", f)
		}
	}
	return out, nil
}

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad size %q", f)
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func TestBenchE2E(t *testing.T) {
	proxies, err := parseProxies(*flagProxies)
	if err != nil {
		t.Fatal(err)
	}
	sizes, root := prologue(t)
	bins := binaries{dsproxy: *flagBin}
	built := make(chan error, 1)
	if bins.dsproxy == "" {
		bins.dsproxy = filepath.Join(t.TempDir(), "dsproxy")
		go func() {
			cmd := exec.Command("go", "build", "-o", bins.dsproxy, "./cmd/dsproxy")
			cmd.Dir = root
			out, err := cmd.CombinedOutput()
			if err != nil {
				err = fmt.Errorf("go build ./cmd/dsproxy: %v\n%s", err, out)
			}
			built <- err
		}()
	} else {
		built <- nil
	}

	cp := startControlPlane(t, root)
	bins.kubeProxy = filepath.Join(cp.Bin, "kube-proxy")
	if _, err := os.Stat(bins.kubeProxy); err != nil {
		t.Fatalf("kube-proxy binary: %v (run hack/controlplane/build.sh)", err)
	}
	cpuMode := controlPlaneCPU(t, cp)
	rep := newReport(sizes, *flagSpread)
	rep.Flags += " control-plane-cpu=" + cpuMode
	if *flagLoad != "api" {
		rep.Flags += " load=" + *flagLoad
	}
	t.Logf("machine: %s; load average at start: %s", rep.Machine, loadavg())

	ld, err := newLoad(t, cp, sizes, *flagSpread)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-built; err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, n := range sizes {
		start := time.Now()
		if err := ld.grow(ctx, n); err != nil {
			t.Fatalf("load %d services: %v", n, err)
		}
		d := time.Since(start)
		t.Logf("load: %d dual-stack Services + %d EndpointSlices in the API server (+%v, %.0f objects/s)",
			n, 2*n, d.Round(time.Millisecond), float64(3*(n-ld.prev))/d.Seconds())
		for _, p := range proxies {
			t.Run(fmt.Sprintf("%d/%s", n, strings.ReplaceAll(p.String(), "/", "-")), func(t *testing.T) {
				rows := runProxy(t, cp, ld, bins, p, n)
				rep.add(rows...)
				t.Logf("\n%s", rep.table(rows))
			})
		}
	}
	if err := rep.mergeAll(*flagMerge); err != nil {
		t.Error(err)
	}
	rep.finish()
	t.Logf("load average at the end: %s", loadavg())
	fmt.Print("\n" + rep.table(rep.Rows) + "\n" + targetTable(rep.Targets))
	if err := rep.write(*flagOut); err != nil {
		t.Error(err)
	}
}

// prologue parses -services and skips the test without root; it returns the
// sizes and the repository's root.
func prologue(t *testing.T) ([]int, string) {
	t.Helper()
	sizes, err := parseSizes(*flagServices)
	if err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return sizes, root
}

// startControlPlane starts the test control plane with the etcd -etcd names.
func startControlPlane(t *testing.T, root string) *framework.ControlPlane {
	t.Helper()
	switch *flagEtcd {
	case "kubernetes":
		out, err := exec.Command(filepath.Join(root, "hack/controlplane/build-etcd.sh")).Output()
		if err != nil {
			t.Fatalf("build-etcd.sh: %v", err)
		}
		t.Setenv("DSPROXY_CP_ETCD", strings.TrimSpace(string(out)))
	case "debian":
		t.Setenv("DSPROXY_CP_ETCD", "")
	default:
		t.Fatalf("-etcd=%q: want kubernetes or debian", *flagEtcd)
	}
	return framework.Start(t)
}

// TestRender writes an earlier run's results.json again (with -merge, joined by
// the other sizes of more runs), with the ratios, the targets and the plot of
// this version of the report, into -out; it measures nothing and needs no root:
//
//	go test -tags e2e,netns -run TestRender ./bench/e2e/ -args -render=out/results.json -out=/tmp/r
func TestRender(t *testing.T) {
	if *flagRender == "" {
		t.Skip("no -render")
	}
	rep, err := readReport(*flagRender)
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.mergeAll(*flagMerge); err != nil {
		t.Fatal(err)
	}
	rep.finish()
	fmt.Print("\n" + rep.table(rep.Rows) + "\n" + targetTable(rep.Targets))
	if err := rep.write(*flagOut); err != nil {
		t.Fatal(err)
	}
}

func repoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("go.mod not found above %s", wd)
		}
	}
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// settleBusy is the machine's CPU use, in cores, under which it counts as quiet.
const settleBusy = 0.25

// settle waits until the machine is quiet (under settleBusy cores over each of
// two consecutive seconds, counting every process), or -settle passed. The API
// server and etcd go on digesting a load, and a proxy its cold start, for a while
// after the last call returns: changes timed meanwhile would time that leftover
// work (the same for every proxy, but not the change).
func settle(t *testing.T, before string) {
	t.Helper()
	if *flagSettle <= 0 {
		return
	}
	quiet, busy, took, err := awaitQuiet(*flagSettle)
	switch {
	case err != nil:
		t.Logf("settle before %s: %v", before, err)
	case !quiet:
		t.Logf("settle before %s: still %.2f cores busy after %v; going on", before, busy, took.Round(time.Second))
	default:
		t.Logf("settle before %s: quiet after %v", before, took.Round(time.Second))
	}
}

// awaitQuiet waits until the machine is quiet (under settleBusy cores over each
// of two consecutive seconds, counting every process), or limit passed; busy is
// the last second's use.
func awaitQuiet(limit time.Duration) (quiet bool, busy float64, took time.Duration, err error) {
	start := time.Now()
	n := 0
	prev, err := cpuTicks()
	for err == nil && n < 2 && time.Since(start) < limit {
		time.Sleep(time.Second)
		var cur [2]uint64
		if cur, err = cpuTicks(); err != nil {
			break
		}
		busy = float64(cur[0]-prev[0]) / float64(max(cur[1]-prev[1], 1)) * float64(runtime.NumCPU())
		prev = cur
		if busy < settleBusy {
			n++
		} else {
			n = 0
		}
	}
	return n >= 2, busy, time.Since(start), err
}

// cpuTicks returns the machine's busy and total CPU time from /proc/stat (all
// CPUs; busy is everything but idle and iowait).
func cpuTicks() ([2]uint64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return [2]uint64{}, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return [2]uint64{}, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var total, idle uint64
	for i, v := range f[1:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return [2]uint64{}, fmt.Errorf("/proc/stat: %q: %w", line, err)
		}
		if i >= 8 { // guest and guest_nice are already in user and nice
			break
		}
		total += n
		if i == 3 || i == 4 { // idle, iowait
			idle += n
		}
	}
	return [2]uint64{total - idle, total}, nil
}
