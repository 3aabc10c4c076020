package app

import (
	"fmt"

	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/dsproxy/dsproxy/pkg/config"
)

// ApplyLogging validates and applies the logging configuration with the
// feature gates --feature-gates or the file's featureGates set, as kube-proxy
// applies its gates before its logging options: --log-text-split-stream needs
// LoggingAlphaOptions=true.
func ApplyLogging(cfg *config.Config) error {
	fg, err := loggingGates(cfg)
	if err != nil {
		return err
	}
	return logsapi.ValidateAndApply(&cfg.Logging, fg)
}

// loggingGates is kube-proxy's feature gate as cfg sets it
// (config.Config.FeatureGate).
func loggingGates(cfg *config.Config) (featuregate.FeatureGate, error) {
	fg, err := cfg.FeatureGate()
	if err != nil {
		return nil, fmt.Errorf("feature gates: %w", err)
	}
	return fg, nil
}
