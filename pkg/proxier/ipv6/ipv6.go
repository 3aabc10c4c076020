// Package ipv6 constructs dsproxy's IPv6 proxier: the family-generic proxier of
// pkg/proxier bound to the IPv6 family descriptor.
package ipv6

import (
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

// Family is the IPv6 descriptor every IPv6 component uses.
var Family = family.IPv6

// New returns the IPv6 proxier for cfg; cfg.Family is set to IPv6.
func New(cfg proxier.Config) (*proxier.Proxier, error) {
	cfg.Family = Family
	return proxier.New(cfg)
}
