//go:build netns

package netns

import (
	"bytes"
	"fmt"
	"io"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"

	vnetns "github.com/vishvananda/netns"
)

// onFreshThread runs fn on a goroutine locked to its OS thread that never unlocks:
// when the goroutine returns, the Go runtime terminates the thread, so whatever
// namespace fn entered can never leak to other goroutines. A panic in fn is returned
// as an error.
func onFreshThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Deliberately no UnlockOSThread.
		defer func() {
			if r := recover(); r != nil {
				errc <- fmt.Errorf("panic: %v\n%s", r, debug.Stack())
			}
		}()
		errc <- fn()
	}()
	return <-errc
}

// RunIn runs fn on a dedicated OS thread inside ns's network namespace and returns
// its error. Sockets (including netlink sockets) that fn opens stay in ns after fn
// returns; goroutines that fn starts do not inherit the namespace, but file
// descriptors they use do. Typical use: a proxier's netlink/nftables calls.
func RunIn(ns *NS, fn func() error) error {
	return onFreshThread(func() error {
		if err := vnetns.Set(ns.handle); err != nil {
			return fmt.Errorf("setns %s: %w", ns.NetnsName, err)
		}
		return fn()
	})
}

// Exec runs a command inside ns's network namespace and returns its combined output.
// It is meant for tests and debugging output (e.g. Exec(ns, "nft", "list",
// "ruleset")); the product must not shell out.
func Exec(ns *NS, name string, args ...string) (string, error) {
	return ExecStdin(ns, nil, name, args...)
}

// ExecStdin is Exec with stdin, e.g. ExecStdin(ns, strings.NewReader(rules), "nft", "-f", "-").
func ExecStdin(ns *NS, stdin io.Reader, name string, args ...string) (string, error) {
	var out bytes.Buffer
	err := RunIn(ns, func() error {
		// The child is forked from this locked thread, so it starts in ns.
		cmd := exec.Command(name, args...)
		cmd.Stdin = stdin
		cmd.Stdout = &out
		cmd.Stderr = &out
		return cmd.Run()
	})
	if err != nil {
		return out.String(), fmt.Errorf("%s: %s %s: %w: %s", ns.Name, name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// Debug returns the namespace's addresses, routes, nftables ruleset and conntrack
// table, for failure messages. Missing tools are reported inline.
func Debug(ns *NS) string {
	var b strings.Builder
	for _, cmd := range [][]string{
		{"ip", "-br", "addr"},
		{"ip", "route"},
		{"ip", "-6", "route"},
		{"nft", "list", "ruleset"},
		{"conntrack", "-L"},
		{"conntrack", "-L", "-f", "ipv6"},
	} {
		out, err := Exec(ns, cmd[0], cmd[1:]...)
		fmt.Fprintf(&b, "### %s: %s\n%s", ns.Name, strings.Join(cmd, " "), out)
		if err != nil {
			fmt.Fprintf(&b, "(%v)\n", err)
		}
	}
	return b.String()
}

// Debug returns Debug output for every namespace of the cluster.
func (c *Cluster) Debug() string {
	var b strings.Builder
	for _, n := range c.Namespaces() {
		b.WriteString(Debug(n))
	}
	return b.String()
}
