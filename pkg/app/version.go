package app

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"

	utilversion "k8s.io/apimachinery/pkg/util/version"

	"github.com/dsproxy/dsproxy/pkg/metrics"
)

// buildInfo is what the Go toolchain recorded about the binary.
type buildInfo struct {
	version, revision, time, goVersion string
	modified                           bool
}

func readBuildInfo() buildInfo {
	b := buildInfo{version: "(devel)", goVersion: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	if v := bi.Main.Version; v != "" {
		b.version = v
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.revision = s.Value
		case "vcs.time":
			b.time = s.Value
		case "vcs.modified":
			b.modified = s.Value == "true"
		}
	}
	return b
}

// reportedVersion is the version --version=vX.Y.Z set, reported instead of
// the build's.
var reportedVersion string

// Version is dsproxy's version: the one --version=vX.Y.Z set, else the module
// version, or for a build from a checkout "(devel)" with the commit ("+dirty"
// when it had changes).
func Version() string {
	if reportedVersion != "" {
		return reportedVersion
	}
	return readBuildInfo().String()
}

// buildInfoMetric is what kubernetes_build_info says about this binary.
func buildInfoMetric() metrics.BuildInfo {
	b := readBuildInfo()
	bi := metrics.BuildInfo{GitVersion: b.version, GitCommit: b.revision, BuildDate: b.time,
		GoVersion: b.goVersion, Compiler: runtime.Compiler, Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if reportedVersion != "" {
		bi.GitVersion = reportedVersion
	}
	if b.revision != "" {
		bi.GitTreeState = "clean"
		if b.modified {
			bi.GitTreeState = "dirty"
		}
	}
	return bi
}

func (b buildInfo) String() string {
	v := b.version
	if v == "(devel)" && b.revision != "" {
		rev := b.revision
		if len(rev) > 12 {
			rev = rev[:12]
		}
		v += " " + rev
		if b.modified {
			v += "+dirty"
		}
	}
	return v
}

// PrintVersion answers kube-proxy's --version flag (its value is flag): a true
// value prints "dsproxy <version>" and "raw" every build detail, and it returns
// true: the caller exits. As kube-proxy's, "vX.Y.Z" (semantic) prints nothing
// and sets the version dsproxy reports (Version, kubernetes_build_info) while
// it goes on. It returns false, printing nothing, when the flag was not given
// ("" or a false value), and an error for a value kube-proxy would refuse.
func PrintVersion(w io.Writer, flag string) (bool, error) {
	b := readBuildInfo()
	switch {
	case flag == "":
		return false, nil
	case flag == "raw":
		fmt.Fprintf(w, "dsproxy.Info{Version:%q, Revision:%q, RevisionTime:%q, Modified:%v, GoVersion:%q, Compiler:%q, Platform:%q, KubeProxyCompatibility:%q}\n",
			b.version, b.revision, b.time, b.modified, b.goVersion, runtime.Compiler, runtime.GOOS+"/"+runtime.GOARCH, "v1.36")
	case strings.HasPrefix(flag, "v"):
		if _, err := utilversion.ParseSemantic(flag); err != nil {
			return false, fmt.Errorf("--version %q: %w", flag, err)
		}
		reportedVersion = flag
		return false, nil
	default:
		on, err := strconv.ParseBool(flag)
		if err != nil {
			return false, fmt.Errorf("--version %q: want true, false, raw or vX.Y.Z", flag)
		}
		if !on {
			return false, nil
		}
		fmt.Fprintf(w, "dsproxy %s\n", b)
	}
	return true, nil
}
