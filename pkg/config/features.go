package config

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/component-base/featuregate"
	"k8s.io/klog/v2"
)

//go:generate ../../hack/kubegates/gen.sh

// FeatureGate returns kube-proxy's feature gate (every gate kube-proxy v1.36
// registers, with its versions and dependencies: kubegates.go, generated from
// kube-proxy itself by hack/kubegates/gen.sh) set from c.FeatureGates. Its
// error is kube-proxy's for the same gates: an unknown name, a gate locked to
// its default set otherwise, a gate not yet available at v1.36, or an enabled
// gate whose dependency is disabled. kube-proxy refuses to start on them, and
// so does dsproxy (Validate). Only a few gates act in dsproxy (see the package
// doc); Enabled answers for any of them as kube-proxy's gate does, AllAlpha and
// AllBeta included.
func (c *Config) FeatureGate() (featuregate.FeatureGate, error) {
	fg, err := newKubeProxyGate()
	if err != nil {
		return nil, err
	}
	// The warnings for GA and deprecated gates are logged once, by the daemon
	// (LogFeatureGateWarnings), not at every validation.
	if err := setGates(fg, klog.Logger{}, c.FeatureGates); err != nil {
		return nil, err
	}
	return fg, nil
}

// LogFeatureGateWarnings logs what kube-proxy logs when it sets c's gates:
// a warning for each GA or deprecated gate set, which a later release drops.
func (c *Config) LogFeatureGateWarnings(logger klog.Logger) {
	fg, err := newKubeProxyGate()
	if err != nil {
		return
	}
	_ = setGates(fg, logger, c.FeatureGates)
}

// setGates is fg.SetFromMap with the warnings logged to logger (component-base's
// gate has the method; its interface does not).
func setGates(fg featuregate.MutableVersionedFeatureGate, logger klog.Logger, m map[string]bool) error {
	if l, ok := fg.(interface {
		SetFromMapWithLogger(klog.Logger, map[string]bool) error
	}); ok {
		return l.SetFromMapWithLogger(logger, m)
	}
	return fg.SetFromMap(m)
}

func newKubeProxyGate() (featuregate.MutableVersionedFeatureGate, error) {
	fg := featuregate.NewVersionedFeatureGate(version.MustParse(kubeProxyGateVersion))
	if err := fg.AddVersioned(kubeProxyGates); err != nil {
		return nil, fmt.Errorf("kube-proxy's feature gates: %w", err)
	}
	if err := fg.AddDependencies(kubeProxyGateDeps); err != nil {
		return nil, fmt.Errorf("kube-proxy's feature gate dependencies: %w", err)
	}
	return fg, nil
}

// knownFeatures is kube-proxy's list of its gates for --feature-gates' help:
// every gate but the GA and deprecated ones, with stage and default.
func knownFeatures() []string {
	fg, err := newKubeProxyGate()
	if err != nil {
		return nil
	}
	return fg.KnownFeatures()
}

// v is version.MustParse, short for kubegates.go.
func v(s string) *version.Version { return version.MustParse(s) }
