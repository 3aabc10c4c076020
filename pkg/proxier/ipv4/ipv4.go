// Package ipv4 constructs dsproxy's IPv4 proxier: the family-generic proxier of
// pkg/proxier bound to the IPv4 family descriptor.
package ipv4

import (
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

// Family is the IPv4 descriptor every IPv4 component uses.
var Family = family.IPv4

// New returns the IPv4 proxier for cfg; cfg.Family is set to IPv4.
func New(cfg proxier.Config) (*proxier.Proxier, error) {
	cfg.Family = Family
	return proxier.New(cfg)
}
