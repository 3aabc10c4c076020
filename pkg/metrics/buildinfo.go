package metrics

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// BuildInfo is what kubernetes_build_info reports about the running binary.
type BuildInfo struct {
	GitVersion, GitCommit, GitTreeState, BuildDate, GoVersion, Compiler, Platform string
}

// NewBuildInfoCollector is kube-proxy's kubernetes_build_info (component-base
// registers it in every Kubernetes component): a gauge of 1 whose labels name
// the build, here dsproxy's, so version inventories built on kube-proxy's
// metric list dsproxy's nodes too. major and minor come from GitVersion
// ("v1.36.3" gives 1 and 36; empty unless it has that shape).
func NewBuildInfoCollector(b BuildInfo) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kubernetes_build_info",
		Help: "A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, Go version, and compiler from which Kubernetes was built, and platform on which it is running.",
	}, []string{"major", "minor", "git_version", "git_commit", "git_tree_state", "build_date", "go_version", "compiler", "platform"})
	major, minor := majorMinor(b.GitVersion)
	g.WithLabelValues(major, minor, b.GitVersion, b.GitCommit, b.GitTreeState, b.BuildDate, b.GoVersion, b.Compiler, b.Platform).Set(1)
	return g
}

// majorMinor splits "vX.Y.Z..." into X and Y.
func majorMinor(v string) (string, string) {
	rest, ok := strings.CutPrefix(v, "v")
	if !ok {
		return "", ""
	}
	f := strings.SplitN(rest, ".", 3)
	if len(f) < 2 || f[0] == "" || f[1] == "" || strings.Trim(f[0]+f[1], "0123456789") != "" {
		return "", ""
	}
	return f[0], f[1]
}
