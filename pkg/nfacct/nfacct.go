// Package nfacct creates and reads the kernel's extended accounting objects
// (nfnetlink_acct): named packet and byte counters that iptables rules count
// into with "-m nfacct --nfacct-name NAME". kube-proxy's iptables mode counts two
// things that way and exports them as metrics; dsproxy's iptables mode does the
// same, with the same object names, so a node switching between the two keeps
// one counter.
//
// Objects belong to a network namespace. A rule can only name an object that
// exists, and an object cannot be deleted while a rule names it.
package nfacct

import (
	"errors"
	"fmt"
)

// The counters kube-proxy's iptables mode creates (pkg/proxy/metrics in
// Kubernetes v1.36), which dsproxy's uses too.
const (
	// CTStateInvalidDropped counts packets dropped because conntrack marked them
	// invalid.
	CTStateInvalidDropped = "ct_state_invalid_dropped_pkts"
	// LocalhostNodePortsAccepted counts connections accepted on NodePorts of
	// 127.0.0.0/8.
	LocalhostNodePortsAccepted = "localhost_nps_accepted_pkts"
)

// MaxNameLen is the longest object name the kernel takes (NFACCT_NAME_MAX less
// the terminating NUL).
const MaxNameLen = 31

// ErrNotFound is returned by Get for an object that does not exist.
var ErrNotFound = errors.New("nfacct object not found")

// Counter is an object's name and counts.
type Counter struct {
	Name    string
	Packets uint64
	Bytes   uint64
}

// Interface is what the proxy uses of the accounting objects.
type Interface interface {
	// Ensure creates the object unless it exists; an existing object keeps its
	// counts.
	Ensure(name string) error
	// Get reads one object (ErrNotFound if it does not exist).
	Get(name string) (Counter, error)
}

func validName(name string) error {
	if name == "" || len(name) > MaxNameLen {
		return fmt.Errorf("nfacct: invalid object name %q (1 to %d bytes)", name, MaxNameLen)
	}
	for i := range len(name) {
		if name[i] == 0 {
			return fmt.Errorf("nfacct: invalid object name %q (NUL byte)", name)
		}
	}
	return nil
}
