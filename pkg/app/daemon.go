package app

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/component-base/featuregate"
	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/config"
	"github.com/dsproxy/dsproxy/pkg/conntrack"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/healthcheck"
	ipt "github.com/dsproxy/dsproxy/pkg/iptables"
	"github.com/dsproxy/dsproxy/pkg/ipvs"
	"github.com/dsproxy/dsproxy/pkg/kubeclient"
	"github.com/dsproxy/dsproxy/pkg/metaproxier"
	"github.com/dsproxy/dsproxy/pkg/metrics"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/nfacct"
	"github.com/dsproxy/dsproxy/pkg/nft"
	"github.com/dsproxy/dsproxy/pkg/nodeip"
	"github.com/dsproxy/dsproxy/pkg/nodeport"
	"github.com/dsproxy/dsproxy/pkg/proxier"
	"github.com/dsproxy/dsproxy/pkg/proxier/iptables"
	"github.com/dsproxy/dsproxy/pkg/proxier/ipv4"
	"github.com/dsproxy/dsproxy/pkg/proxier/ipv6"
	ipvsbackend "github.com/dsproxy/dsproxy/pkg/proxier/ipvs"
	"github.com/dsproxy/dsproxy/pkg/proxier/nftables"
	"github.com/dsproxy/dsproxy/pkg/runner"
	"github.com/dsproxy/dsproxy/pkg/watch"
)

// Daemon is an assembled dsproxy. New builds it; Run runs it.
type Daemon struct {
	cfg      *config.Config
	client   *kubeclient.Client
	nodeName string
	spec     nodeip.Spec
	meta     *metaproxier.MetaProxier
	registry *nodeport.Registry
	proxiers map[*family.Family]*proxier.Proxier
	kernels  []*nft.Netlink
	closers  []func()
	// iptFlavor is the iptables flavour (nft or legacy) the node uses, detected
	// once in the iptables and ipvs modes.
	iptFlavor   ipt.Flavor
	iptDetected bool
	metrics     *metrics.Metrics
	health      *healthcheck.ProxyHealthServer
	svcHC       *healthcheck.ServiceHealthServer
	local       *localState
	cold        *coldStart
	// restoreGC undoes the cold start's GOGC (see tightenGC); set before the
	// first syncs start, called once they are all done.
	restoreGC func()
	// tcpBeLiberal: nf_conntrack_tcp_be_liberal is set, so no backend drops
	// packets conntrack marks invalid.
	tcpBeLiberal bool
	acct         *nfacct.Netlink // iptables mode
	events       *recorder       // nil without an API client
	ipvsChecked  bool            // the IPVS scheduler was checked
}

// New assembles the daemon: it reads the Node for node IPs and decides which
// families run, and opens a netlink connection per family. It programs nothing.
func New(ctx context.Context, cfg *config.Config, client *kubeclient.Client) (*Daemon, error) {
	switch cfg.ProxyMode {
	case config.ModeNFTables, config.ModeIPTables, config.ModeIPVS:
	default:
		return nil, fmt.Errorf("--proxy-mode %q: want %q, %q or %q", cfg.ProxyMode, config.ModeNFTables, config.ModeIPTables, config.ModeIPVS)
	}
	name, err := NodeName(cfg)
	if err != nil {
		return nil, err
	}
	spec, err := NodeIPSpec(cfg)
	if err != nil {
		return nil, err
	}
	npSpecs, err := nodeport.ParseAddresses(cfg.NodePortAddresses)
	if err != nil {
		return nil, fmt.Errorf("--nodeport-addresses: %w", err)
	}
	// --cleanup-kube-proxy keeps IPVS virtual servers in these.
	kubeProxyExclude := excludeCIDRs(cfg.IPVS.ExcludeCIDRs)
	d := &Daemon{cfg: cfg, client: client, nodeName: name, spec: spec,
		registry: nodeport.New(klog.Background()), proxiers: map[*family.Family]*proxier.Proxier{}, metrics: metrics.New()}
	nodeport.MustRegister(d.metrics.Registry())
	d.metrics.Registry().MustRegister(metrics.NewBuildInfoCollector(buildInfoMetric()))
	d.health = healthcheck.NewProxyHealthServer(healthcheck.ProxyHealthConfig{Health: d.Health, Recorder: d.metrics})
	if client != nil {
		d.events = newRecorder(client, name)
	}
	d.svcHC = healthcheck.NewServiceHealthServer(healthcheck.ServiceHealthConfig{ProxyHealthy: d.health.Healthy,
		OnListenError: d.events.healthCheckFailed})
	d.local = newLocalState(d.metrics, d.svcHC)
	node, err := waitForNode(ctx, client, name, 30*time.Second)
	if err != nil {
		return nil, err
	}
	if cfg.DetectLocalMode == config.LocalModeNodeCIDR && len(podCIDRs(node)) == 0 {
		klog.InfoS("Waiting for the node's PodCIDRs (--detect-local-mode=NodeCIDR)", "node", name, "timeout", podCIDRsTimeout)
		get := func(ctx context.Context) (*v1.Node, error) { return client.Node(ctx, name) }
		if node, err = waitForPodCIDRs(ctx, get, podCIDRsTimeout, time.Second); err != nil {
			return nil, err
		}
	}
	d.health.SetNode(node)
	ips, err := nodeip.NodeIPs(node, spec, nodeIPOptions(spec))
	switch {
	case errors.Is(err, nodeip.ErrNoAddresses) && spec.IsZero():
		// Each family then has the loopback node IP, but a --bind-address's. In
		// kube-proxy's words, unless --bind-address gave the primary one:
		if !bindNodeIP(cfg).IsValid() {
			klog.InfoS("Can't determine this node's IP, assuming loopback; if this is incorrect, please set the --bind-address flag", "node", name, "reason", err.Error())
		}
	case err != nil:
		return nil, fmt.Errorf("node IPs of %s: %w", name, err)
	}
	nodeIPs := familyNodeIPs(ips, bindNodeIP(cfg))
	klog.InfoS("Node IPs", "node", name, "ips", ips.String(), "bindAddress", cfg.BindAddress)
	if d.tcpBeLiberal = tcpBeLiberal(conntrack.HostSysFS.ProcSys, cfg.Conntrack.TCPBeLiberal); d.tcpBeLiberal {
		klog.InfoS("nf_conntrack_tcp_be_liberal set, not installing DROP rules for INVALID packets")
	}
	var fps []metaproxier.FamilyProxier
	famIPs := map[*family.Family]netip.Addr{}
	for _, f := range family.All {
		ip, ok, why := familyNodeIP(f, ips, nodeIPs, "/proc")
		if !ok {
			klog.InfoS("Not proxying this family", "ipFamily", f.Name, "reason", why)
			continue
		}
		famIPs[f] = ip
		if f.Loopback.Contains(ip) {
			klog.InfoS("No node IP of this family; assuming loopback, as kube-proxy does (set --node-ip or --bind-address if that is wrong)",
				"ipFamily", f.Name, "nodeIP", ip)
		}
		p, err := d.newProxier(f, ip, npSpecs[f], node)
		if err != nil {
			d.Close()
			return nil, err
		}
		d.proxiers[f] = p
		fps = append(fps, p)
	}
	if len(fps) == 0 {
		d.Close()
		return nil, fmt.Errorf("%w (node IPs %s)", errNoFamily, ips.String())
	}
	primary := family.IPv4
	if f := family.Of(ips.Primary); f != nil {
		primary = f
	}
	if f := family.Of(bindNodeIP(cfg)); f != nil {
		primary = f
	}
	for _, w := range badConfig(cfg, primary, famIPs, podCIDRs(node), len(fps) == 2) {
		klog.ErrorS(errors.New(w), "Configuration may be incomplete or incorrect")
	}
	d.cold = newColdStart(slices.Collect(maps.Keys(d.proxiers)), func() {
		if d.restoreGC != nil {
			d.restoreGC()
		}
		releaseMemory()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		k, err := nft.NewNetlink()
		if err != nil {
			klog.ErrorS(err, "Removing the other proxy mode's rules: opening netlink")
			return
		}
		defer k.Close()
		if err := cleanupOtherMode(ctx, cfg.ProxyMode, ipt.Resolve(ctx, family.IPv4, d.iptFlavor), k); err != nil {
			klog.ErrorS(err, "Removing the other proxy mode's rules")
		}
		if cfg.CleanupKubeProxy {
			// Big kube-proxy iptables rulesets take a while to save and undo.
			kctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			scope := ipvsScope{none: cfg.ProxyMode == config.ModeIPVS, kubeProxyOnly: true, exclude: kubeProxyExclude,
				nodePorts: nodePortKeys(d.registry.Snapshot())}
			if err := cleanupKubeProxy(kctx, k, scope); err != nil {
				klog.ErrorS(err, "Removing kube-proxy's state")
			}
		}
	})
	if d.meta, err = metaproxier.New(fps...); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// iptablesRunner returns the family's iptables runner (iptables and ipvs
// modes), of the flavour detected once for both families.
func (d *Daemon) iptablesRunner(f *family.Family) (*ipt.Runner, error) {
	if !d.iptDetected {
		var why string
		d.iptFlavor, why = ipt.Detect(context.Background(), nil)
		d.iptDetected = true
		klog.InfoS("iptables flavour", "flavour", cmp.Or(string(d.iptFlavor), "the iptables on PATH"), "because", why)
	}
	r, err := ipt.New(f, d.iptFlavor)
	if err != nil {
		return nil, fmt.Errorf("%s: %s mode: %w", f, d.cfg.ProxyMode, err)
	}
	return r, nil
}

// newIPVSBackend returns the family's IPVS-mode backend, with IPVS's timeouts
// set (they are the namespace's, so the second family sets them again).
func (d *Daemon) newIPVSBackend(f *family.Family) (proxier.Backend, error) {
	exclude := excludeCIDRs(d.cfg.IPVS.ExcludeCIDRs)
	r, err := d.iptablesRunner(f)
	if err != nil {
		return nil, err
	}
	k, err := ipvs.Open(f, "", true)
	if err != nil {
		return nil, fmt.Errorf("%s: ipvs mode: %w", f, err)
	}
	d.closers = append(d.closers, k.Close)
	if !d.ipvsChecked {
		// As kube-proxy: a scheduler IPVS lacks is a startup error, not a sync
		// failure forever.
		if err := checkIPVSScheduler(cmp.Or(d.cfg.IPVS.Scheduler, "rr")); err != nil {
			return nil, err
		}
		d.ipvsChecked = true
	}
	setIPVSTimeouts(k, d.cfg)
	return ipvsbackend.New(f, k, r, ipvsbackend.Options{
		Scheduler:     d.cfg.IPVS.Scheduler,
		ExcludeCIDRs:  exclude,
		MasqueradeBit: int(d.cfg.MasqueradeBit()),
		StrictARP:     d.cfg.IPVS.StrictARP,
		TCPBeLiberal:  d.tcpBeLiberal,
	}), nil
}

// setIPVSTimeouts sets --ipvs-tcp-timeout, --ipvs-tcpfin-timeout and
// --ipvs-udp-timeout. As in kube-proxy, a failure (the kernel refuses a timeout
// over INT_MAX jiffies, about 99 days at HZ=250) is logged and the proxy runs on
// with the kernel's timeouts.
func setIPVSTimeouts(k *ipvs.Kernel, cfg *config.Config) {
	if err := k.SetTimeouts(cfg.IPVS.TCPTimeout, cfg.IPVS.TCPFinTimeout, cfg.IPVS.UDPTimeout); err != nil {
		klog.ErrorS(err, "Failed to configure IPVS timeouts")
	}
}

// nfacct returns the iptables mode's nfacct client, shared by both families,
// and on first use registers the metrics read from its counters.
func (d *Daemon) nfacct() nfacct.Interface {
	if d.acct == nil {
		d.acct = nfacct.New()
		d.metrics.Registry().MustRegister(metrics.NewNFAcctCollector(d.acct))
	}
	return d.acct
}

// newBackend returns the family's backend for the configured --proxy-mode.
func (d *Daemon) newBackend(f *family.Family) (proxier.Backend, error) {
	if d.cfg.ProxyMode == config.ModeIPVS {
		return d.newIPVSBackend(f)
	}
	if d.cfg.ProxyMode == config.ModeIPTables {
		r, err := d.iptablesRunner(f)
		if err != nil {
			return nil, err
		}
		return iptables.New(f, r, iptables.Options{
			MasqueradeBit:      int(d.cfg.MasqueradeBit()),
			LocalhostNodePorts: d.cfg.IPTables.LocalhostNodePorts,
			TCPBeLiberal:       d.tcpBeLiberal,
			NFAcct:             d.nfacct(),
		})
	}
	k, err := nft.NewNetlink()
	if err != nil {
		return nil, fmt.Errorf("%s: opening netlink: %w", f, err)
	}
	d.kernels = append(d.kernels, k)
	return nftables.New(f, k, nftables.Options{
		RebuildEvery: 1, TCPBeLiberal: d.tcpBeLiberal, MasqueradeMark: 1 << d.cfg.MasqueradeBit(),
	}), nil
}

func (d *Daemon) newProxier(f *family.Family, ip netip.Addr, np nodeport.Spec, node *v1.Node) (*proxier.Proxier, error) {
	b, err := d.newBackend(f)
	if err != nil {
		return nil, err
	}
	var addrs nodeport.AddrLister
	if d.cfg.ProxyMode == config.ModeIPVS {
		addrs = ipvs.HostAddrs{} // the Service addresses on dsproxy-ipvs0 are no NodePort addresses
	}
	newFamily := ipv4.New
	if f == ipv6.Family {
		newFamily = ipv6.New
	}
	return newFamily(proxier.Config{
		NodeName:     d.nodeName,
		Backend:      b,
		NodePorts:    d.registry,
		NodePortSpec: np,
		Addrs:        addrs,
		LocalAddrs:   d.cfg.ProxyMode == config.ModeIPVS,
		// kube-proxy's IPVS mode syncs every syncPeriod, the others on changes.
		ObserveIdleSyncs: d.cfg.ProxyMode == config.ModeIPVS,
		NodeIP:           ip,
		Local:            localDetector(d.cfg, f, node),
		MasqueradeAll:    d.cfg.MasqueradeAll,
		Runner:           runnerOptions(d.cfg),
		HealthTimeout:    healthTimeout(d.cfg),
		Observer:         d.metrics,
		Conntrack:        conntrack.New(),
		NoExternalIPs:    !gateEnabled(d.cfg, "AllowServiceExternalIPs"),
		// Called after every successful full sync, the first one included.
		LocalStateChanged: func(f *family.Family, st *model.State, node *proxier.NodeConfig) {
			d.local.update(f, st, node.NodePortAddresses)
			d.cold.synced(f)
		},
		LocalStateUnchanged: d.svcHC.RetryFailed,
	})
}

// FullSyncPeriod is the time between periodic full syncs, kube-proxy's
// (v1.36) proxyutil.FullSyncPeriod. Each rebuilds the family's table under its other
// name and swaps it in, which also repairs anything changed by hand.
const FullSyncPeriod = time.Hour

// runnerOptions maps kube-proxy's sync settings onto a family runner as kube-proxy
// v1.36 uses them: minSyncPeriod spaces syncs; a full sync runs every FullSyncPeriod;
// syncPeriod bounds the retry backoff and, as dsproxy's addition, starts a partial
// sync when nothing else did for that long, which follows changed node addresses and
// costs next to nothing otherwise.
func runnerOptions(c *config.Config) runner.Options {
	return runner.Options{
		MinInterval:      c.MinSyncPeriod,
		FullResyncPeriod: FullSyncPeriod,
		CheckPeriod:      c.SyncPeriod,
		RetryMax:         c.SyncPeriod,
	}
}

// healthTimeout is how long a queued change may wait for a successful sync before
// /healthz and /livez report the family unhealthy: kube-proxy v1.36's twice
// syncPeriod.
func healthTimeout(c *config.Config) time.Duration { return 2 * c.SyncPeriod }

// Families returns the families the daemon proxies.
func (d *Daemon) Families() []*family.Family { return d.meta.Families() }

// Health reports per-family status.
func (d *Daemon) Health() map[*family.Family]metaproxier.FamilyStatus { return d.meta.Health() }

// Proxier returns the family's proxier, or nil.
func (d *Daemon) Proxier(f *family.Family) *proxier.Proxier { return d.proxiers[f] }

// Run starts the informers, waits for their caches so the first sync programs the
// whole cluster rather than a partial view (a partial view would reject Services
// whose endpoints were not listed yet), then runs both families until ctx is done.
// Stopping leaves the rules in place: a restarted dsproxy takes over from them.
func (d *Daemon) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// kube-proxy's --bind-address-hard-fail: a server failure stops the proxy.
	fail := func(server string) func(error) {
		if !d.cfg.BindAddressHardFail {
			return nil
		}
		return func(err error) {
			d.events.serverFailed(server, err)
			cancel(err)
		}
	}
	go serveHTTP(ctx, "metrics", d.cfg.MetricsBindAddress, metricsMux(d.metrics, d.cfg), fail("metrics"))
	go serveHTTP(ctx, "healthz", d.cfg.HealthzBindAddress, d.health.Handler(), fail("healthz"))
	defer d.svcHC.Close()
	d.applyConntrackSysctls()
	h := &handler{MetaProxier: d.meta, d: d}
	err := watch.Start(ctx, d.client, h, watch.Options{NodeName: d.nodeName, ResyncPeriod: d.cfg.ConfigSyncPeriod, ServiceCIDRs: true})
	if err == nil {
		d.events.starting(fmt.Sprintf("dsproxy %s, %s mode", Version(), d.cfg.ProxyMode))
		// The first syncs, not the informers' lists, make the cold start's peak.
		d.restoreGC = tightenGC(coldStartGCPercent)
		err = d.meta.Run(ctx)
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause // a server failed with --bind-address-hard-fail, or the --config file changed
	}
	return err
}

// Close releases the netlink connections and waits a little for Events being
// posted.
func (d *Daemon) Close() {
	d.events.flush(5 * time.Second)
	for _, k := range d.kernels {
		_ = k.Close()
	}
	for _, c := range d.closers {
		c()
	}
}

// handler adds to the MetaProxier's fan-out what is shared by the families: the
// NodePort registry and the node IPs.
type handler struct {
	*metaproxier.MetaProxier
	d *Daemon
}

func (h *handler) OnServiceAdd(s *v1.Service) { h.d.registry.Update(s); h.MetaProxier.OnServiceAdd(s) }

func (h *handler) OnServiceUpdate(old, cur *v1.Service) {
	h.d.registry.Update(cur)
	h.MetaProxier.OnServiceUpdate(old, cur)
}

func (h *handler) OnServiceDelete(s *v1.Service) {
	h.d.registry.Delete(s)
	h.MetaProxier.OnServiceDelete(s)
}

func (h *handler) OnNodeAdd(n *v1.Node) {
	h.d.health.SetNode(n)
	h.followNodeIPs(n)
	h.followPodCIDRs(n)
	h.MetaProxier.OnNodeAdd(n)
}

func (h *handler) OnNodeUpdate(old, cur *v1.Node) {
	h.d.health.SetNode(cur)
	h.followNodeIPs(cur)
	h.followPodCIDRs(cur)
	h.MetaProxier.OnNodeUpdate(old, cur)
}

func (h *handler) OnNodeDelete(n *v1.Node) {
	h.d.health.SetNode(nil)
	h.MetaProxier.OnNodeDelete(n)
}

// metricsMux is kube-proxy's metrics server: /metrics, /healthz answering ok
// (and /metrics/slis, see zpages.go), /proxyMode naming the mode, /configz the
// effective configuration, /flagz and /statusz, and with profiling the Go
// profiles under /debug/pprof/ and /debug/flags/v.
func metricsMux(m *metrics.Metrics, cfg *config.Config) http.Handler {
	mode, profiling := cfg.ProxyMode, cfg.EnableProfiling
	mux := &listingMux{ServeMux: http.NewServeMux()}
	installHealthz(mux)
	// As kube-proxy's component-base configz: the v1alpha1 object under the
	// config group's name.
	configz, err := json.Marshal(map[string]any{config.GroupName: cfg.KubeProxyConfiguration()})
	mux.HandleFunc("/configz", func(w http.ResponseWriter, _ *http.Request) {
		if err != nil {
			http.Error(w, "error marshaling json: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write(configz)
	})
	mux.Handle("/metrics", m.Handler())
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = fmt.Fprint(w, mode)
	})
	if gateEnabled(cfg, "ComponentFlagz") {
		installFlagz(mux, cfg.Flags)
	}
	if gateEnabled(cfg, "ComponentStatusz") {
		installStatusz(mux)
	}
	if profiling {
		// As kube-proxy's (apiserver's routes.Profiling): no cmdline (the
		// index answers it as an unknown profile), and /debug/pprof redirects.
		mux.ServeMux.HandleFunc("/debug/pprof", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "/debug/pprof/", http.StatusFound)
		})
		mux.ServeMux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.ServeMux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.ServeMux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.ServeMux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		installDebugFlags(mux.ServeMux)
	}
	return mux
}

// nodeIPOptions: the node IPs come from the Node's addresses. Without any, as
// kube-proxy, there are none (each family's node IP is then loopback, and
// "primary" NodePort addresses are every local address) unless --node-ip asks
// for some: those are then looked for among the local interfaces' addresses,
// as the kubelet does.
func nodeIPOptions(spec nodeip.Spec) nodeip.Options {
	o := nodeip.Options{Mode: nodeip.NoCloud}
	if !spec.IsZero() {
		o.Interfaces = nodeip.HostInterfaces{}
	}
	return o
}

// followNodeIPs recomputes the node IPs from a changed Node, so NodePorts on the
// primary address follow it without a restart. A Node whose addresses no longer
// yield an IP of a running family keeps the last good one.
func (h *handler) followNodeIPs(n *v1.Node) {
	ips, err := nodeip.NodeIPs(n, h.d.spec, nodeIPOptions(h.d.spec))
	switch {
	case errors.Is(err, nodeip.ErrNoAddresses):
		klog.V(2).InfoS("Node lists no addresses; keeping previous node IPs", "node", n.Name)
		return
	case err != nil:
		klog.ErrorS(err, "Keeping previous node IPs", "node", n.Name)
		return
	}
	nodeIPs := familyNodeIPs(ips, bindNodeIP(h.d.cfg))
	for f, p := range h.d.proxiers {
		if ip, ok := nodeIPs[f]; ok {
			p.SetNodeIP(ip)
		}
	}
}

// followPodCIDRs, with --detect-local-mode=NodeCIDR, gives each family the local
// detection of the Node's current PodCIDRs (the Node was deleted and registered
// again with others): kube-proxy exits to pick them up; dsproxy reprograms in place,
// as it follows node IPs. A Node without PodCIDRs of a family keeps the last ones.
func (h *handler) followPodCIDRs(n *v1.Node) {
	if h.d.cfg.DetectLocalMode != config.LocalModeNodeCIDR || n == nil || n.Name != h.d.nodeName {
		return
	}
	for f, p := range h.d.proxiers {
		if c := familyCIDRs(f, podCIDRs(n)); len(c) > 0 {
			p.SetLocalDetector(proxier.LocalDetector{Mode: proxier.LocalModeNodeCIDR, CIDRs: c})
		}
	}
}

// applyConntrackSysctls applies kube-proxy's conntrack tuning. Failures are logged:
// a node whose sysctls cannot be changed (a read-only /sys) still gets its
// Services.
func (d *Daemon) applyConntrackSysctls() {
	if err := conntrackSysctls(d.cfg, conntrack.HostSysFS).Apply(conntrack.HostSysFS, conntrack.HostSysFS.NumCPU()); err != nil {
		klog.ErrorS(err, "Some conntrack settings could not be applied")
	}
}

// conntrackSysctls are kube-proxy's conntrack settings of cfg that fs's network
// namespace can take: all of them in the initial one; elsewhere (a kind node, a
// node that is itself a container, the tests' and the demo's namespaces) only
// the per-namespace ones (timeouts, be_liberal), as nf_conntrack_max and the
// hash size are the machine's and read-only there. kube-proxy tries them all and
// fails to start there unless conntrack.maxPerCore is 0 (kind sets it so).
func conntrackSysctls(cfg *config.Config, fs conntrack.SysFS) conntrack.Sysctls {
	c := cfg.Conntrack
	s := conntrack.Sysctls{MaxPerCore: int(c.MaxPerCore), Min: int(c.Min),
		TCPEstablishedTimeout: c.TCPEstablishedTimeout, TCPCloseWaitTimeout: c.TCPCloseWaitTimeout,
		TCPBeLiberal: c.TCPBeLiberal, UDPTimeout: c.UDPTimeout, UDPStreamTimeout: c.UDPStreamTimeout}
	global, known := fs.Global()
	if !known {
		global = fs == conntrack.HostSysFS && inHostNetns()
	}
	if !global && s.Max(fs.NumCPU()) > 0 {
		klog.InfoS("Not in the machine's initial network namespace; leaving nf_conntrack_max and the conntrack hash size alone")
		s = s.NetnsOnly()
	}
	return s
}

// inHostNetns reports whether the calling thread is in the network namespace of
// PID 1 (in a pod without hostPID that is the pod's own); dsproxy's threads all
// are, or none. Only the fallback of conntrackSysctls when conntrack is not
// loaded yet.
func inHostNetns() bool {
	self, err1 := os.Readlink("/proc/thread-self/ns/net")
	host, err2 := os.Readlink("/proc/1/ns/net")
	return err1 == nil && err2 == nil && self == host
}

// tcpBeLiberal reports whether net.netfilter.nf_conntrack_tcp_be_liberal is or
// will be set (willSet: --conntrack-tcp-be-liberal, which Run applies), read from
// procSys ("/proc/sys"). As kube-proxy's iptables mode, dsproxy then installs no
// rule that drops packets conntrack marks invalid: the kernel no longer marks the
// out-of-window TCP packets that rule was for, and on multihomed nodes the rule
// drops legitimate traffic. An unreadable sysctl (no conntrack yet) counts as
// unset.
func tcpBeLiberal(procSys string, willSet bool) bool {
	if willSet {
		return true
	}
	b, err := os.ReadFile(filepath.Join(procSys, "net/netfilter/nf_conntrack_tcp_be_liberal"))
	if err != nil {
		return false
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return err == nil && v != 0
}

// nodePortKeys are the NodePorts claimed, as IPVS keys without an address.
func nodePortKeys(claims []nodeport.Claim) map[ipvs.Key]bool {
	out := make(map[ipvs.Key]bool, len(claims))
	for _, c := range claims {
		out[ipvs.Key{Proto: model.ProtoNumber(c.Key.Protocol), Port: c.Key.Port}] = true
	}
	return out
}

// gateEnabled reads one of kube-proxy's feature gates as kube-proxy's gate
// answers it (config.Config.FeatureGate): as set, or its v1.36 default, with
// AllAlpha and AllBeta applied. The configuration was validated before; should
// its gates fail anyway, name reads as its default.
func gateEnabled(cfg *config.Config, name string) bool {
	fg, err := cfg.FeatureGate()
	if err != nil {
		fg, _ = (&config.Config{}).FeatureGate()
	}
	return fg.Enabled(featuregate.Feature(name))
}

// checkIPVSScheduler checks that IPVS has the scheduler (ipvs.CheckScheduler).
func checkIPVSScheduler(name string) error {
	k, err := ipvs.Open(family.IPv4, "", true)
	if err != nil {
		return fmt.Errorf("ipvs mode: %w", err)
	}
	defer k.Close()
	if err := k.CheckScheduler(name); err != nil {
		return fmt.Errorf("ipvs mode: --ipvs-scheduler: %w", err)
	}
	return nil
}
