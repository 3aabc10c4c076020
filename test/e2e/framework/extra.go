//go:build e2e

package framework

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// withLock runs fn holding the lock the hack/controlplane scripts take
// (${RUN}.lock), so it does not race with up.sh or down.sh of another process.
func (cp *ControlPlane) withLock(fn func() error) error {
	f, err := os.OpenFile(cp.RunDir+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer f.Close() // releases the lock
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return fn()
}

// APIServerPID returns the pid of the running kube-apiserver recorded by up.sh,
// checking (as lib.sh's our_pid does) that the process still is kube-apiserver.
func (cp *ControlPlane) APIServerPID() (int, error) {
	pid, _, err := cp.recordedProcess("kube-apiserver")
	return pid, err
}

// ProcessPIDs returns the pids of the running etcd, kube-apiserver and
// kube-controller-manager recorded by up.sh.
func (cp *ControlPlane) ProcessPIDs() ([]int, error) {
	return cp.PIDs("etcd", "kube-apiserver", "kube-controller-manager")
}

// PIDs returns the pids up.sh recorded for the named control-plane processes
// (etcd, kube-apiserver, kube-controller-manager), in that order, each
// checked to be still running as that program.
func (cp *ControlPlane) PIDs(names ...string) ([]int, error) {
	var out []int
	for _, name := range names {
		pid, _, err := cp.recordedProcess(name)
		if err != nil {
			return nil, err
		}
		out = append(out, pid)
	}
	return out, nil
}

func (cp *ControlPlane) recordedProcess(name string) (int, []string, error) {
	b, err := os.ReadFile(filepath.Join(cp.RunDir, name+".pid"))
	if err != nil {
		return 0, nil, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, nil, fmt.Errorf("%s.pid: %w", name, err)
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return 0, nil, fmt.Errorf("%s (pid %d) is not running: %w", name, pid, err)
	}
	argv := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
	if len(argv) == 0 || filepath.Base(argv[0]) != name {
		return 0, nil, fmt.Errorf("pid %d is %q, not %s", pid, argv, name)
	}
	return pid, argv, nil
}

// RestartAPIServer stops kube-apiserver (SIGTERM, SIGKILL after 10s) and starts
// it again with the same command line inside the control-plane namespace, the
// way up.sh does (own session, log appended to logs/kube-apiserver.log, pid in
// kube-apiserver.pid), then waits for /readyz. etcd and
// kube-controller-manager keep running. It returns how long the API server was
// unavailable (from the signal to a ready /readyz).
//
// Every client of the control plane sees the outage, including other test
// processes sharing it (see OtherLeases).
func (cp *ControlPlane) RestartAPIServer(ctx context.Context) (time.Duration, error) {
	return cp.RestartAPIServerWith(ctx, nil)
}

// RestartAPIServerWith is RestartAPIServer that runs whileDown (if not nil)
// once the API server has exited and before it starts again: for writing into
// etcd with no API server watching. An error of whileDown is returned after
// the API server is up again.
func (cp *ControlPlane) RestartAPIServerWith(ctx context.Context, whileDown func() error) (time.Duration, error) {
	var (
		down    time.Time
		newPID  int
		exited  = make(chan struct{})
		status  error
		downErr error
	)
	err := cp.withLock(func() error {
		pid, argv, err := cp.recordedProcess("kube-apiserver")
		if err != nil {
			return err
		}
		down = time.Now()
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			return fmt.Errorf("kill kube-apiserver (pid %d): %w", pid, err)
		}
		if !waitGone(pid, 10*time.Second) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			if !waitGone(pid, 5*time.Second) {
				return fmt.Errorf("kube-apiserver (pid %d) did not exit", pid)
			}
		}
		if whileDown != nil {
			downErr = whileDown()
		}
		logf, err := os.OpenFile(filepath.Join(cp.RunDir, "logs", "kube-apiserver.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		defer logf.Close()
		fmt.Fprintf(logf, "\n==== framework: kube-apiserver restarted at %s ====\n", time.Now().Format(time.RFC3339Nano))
		// `ip netns exec` execs the command: the pid is kube-apiserver's.
		cmd := exec.Command("ip", append([]string{"netns", "exec", cp.NetNS}, argv...)...)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start kube-apiserver: %w", err)
		}
		// Wait (not /proc/<pid>/cmdline, which reads empty for a moment
		// while `ip netns exec` execs kube-apiserver) says whether it exited.
		go func() { status = cmd.Wait(); close(exited) }()
		newPID = cmd.Process.Pid
		return os.WriteFile(filepath.Join(cp.RunDir, "kube-apiserver.pid"), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644)
	})
	if err != nil {
		return 0, err
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*Timeout, true, func(ctx context.Context) (bool, error) {
		select {
		case <-exited:
			return false, fmt.Errorf("kube-apiserver (pid %d) exited: %v", newPID, status)
		default:
		}
		body, err := cp.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && strings.TrimSpace(string(body)) == "ok", nil
	})
	if err != nil {
		return 0, fmt.Errorf("kube-apiserver not ready after restart: %w\n%s", err, cp.LogTail("kube-apiserver", 30))
	}
	if downErr != nil {
		return 0, fmt.Errorf("while kube-apiserver was down: %w", downErr)
	}
	return time.Since(down), nil
}

func waitGone(pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if !running(pid) {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// running reports whether pid is a live process: it exists and is no zombie
// (which keeps its pid until reaped). The state is the field after the
// parenthesised command name of /proc/<pid>/stat.
func running(pid int) bool {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(raw, ')')
	return i >= 0 && i+2 < len(raw) && raw[i+2] != 'Z' && raw[i+2] != 'X'
}

// LogTail returns the last n lines of logs/<component>.log.
func (cp *ControlPlane) LogTail(component string, n int) string {
	b, err := os.ReadFile(filepath.Join(cp.RunDir, "logs", component+".log"))
	if err != nil {
		return err.Error()
	}
	return Tail(string(b), n)
}

// Tail returns the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// OtherLeases returns the pids of other live test processes using the control
// plane (their leases, see Start).
func (cp *ControlPlane) OtherLeases() []int {
	entries, _ := os.ReadDir(filepath.Dir(cp.lease))
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if syscall.Kill(pid, 0) == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Unlink forgets a namespace linked with Start or Link whose owner deletes it
// (the veth pair goes with the namespace): its link number is freed for later
// links. Namespaces up.sh created itself are left to down.sh.
func (cp *ControlPlane) Unlink(netns string) error {
	if netns == "" || strings.ContainsRune(netns, '/') {
		return fmt.Errorf("bad netns name %q", netns)
	}
	return cp.withLock(func() error {
		dir := filepath.Join(cp.RunDir, "links")
		if _, err := os.Stat(filepath.Join(dir, netns+".created")); err == nil {
			return nil
		}
		if err := os.Remove(filepath.Join(dir, netns)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	})
}

// ServiceAccountKubeconfig writes a kubeconfig for server (e.g.
// https://172.31.255.1:6443) that authenticates as the ServiceAccount ns/name
// with a bound token (TokenRequest) valid for ttl, so a process can run with
// exactly that account's RBAC.
func (cp *ControlPlane) ServiceAccountKubeconfig(ctx context.Context, ns, name, server, path string, ttl time.Duration) error {
	secs := int64(ttl / time.Second)
	tr, err := cp.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token for serviceaccount %s/%s: %w", ns, name, err)
	}
	ca, err := os.ReadFile(filepath.Join(cp.RunDir, "pki", "ca.crt"))
	if err != nil {
		return err
	}
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: dsproxy-cp
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: dsproxy-cp
  context:
    cluster: dsproxy-cp
    user: %s
current-context: dsproxy-cp
`, server, base64.StdEncoding.EncodeToString(ca), name, tr.Status.Token, name)
	return os.WriteFile(path, []byte(kc), 0o600)
}

// KubeProxyConfig is a KubeProxyConfiguration for running the control plane's
// kube-proxy in a test node: the given kubeconfig, node name, mode ("iptables",
// "nftables", "ipvs"), cluster CIDRs (comma-separated) and metrics and healthz
// addresses. The conntrack sysctls are left alone (0): nf_conntrack_max is
// read-only outside the initial network namespace, and others are global to the
// machine.
func KubeProxyConfig(kubeconfig, node, mode, clusterCIDRs, metricsAddr, healthzAddr string) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %s
hostnameOverride: %s
mode: %s
clusterCIDR: %s
metricsBindAddress: %s
healthzBindAddress: %s
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, kubeconfig, node, mode, clusterCIDRs, metricsAddr, healthzAddr)
}
