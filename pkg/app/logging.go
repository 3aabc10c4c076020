package app

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/dsproxy/dsproxy/pkg/config"
)

// ApplyLogging validates and applies the logging configuration with the logging
// feature gates (LoggingAlphaOptions, LoggingBetaOptions, ContextualLogging) set as
// --feature-gates or the file's featureGates set them, as kube-proxy applies its
// gates before its logging options: --log-text-split-stream needs
// LoggingAlphaOptions=true. Other gates are not the logging package's.
func ApplyLogging(cfg *config.Config) error {
	fg, err := loggingGates(cfg)
	if err != nil {
		return err
	}
	return logsapi.ValidateAndApply(&cfg.Logging, fg)
}

// loggingGates are the logging package's feature gates as cfg sets them.
func loggingGates(cfg *config.Config) (featuregate.FeatureGate, error) {
	fg := featuregate.NewVersionedFeatureGate(version.MustParse("1.36"))
	if err := logsapi.AddFeatureGates(fg); err != nil {
		return nil, err
	}
	known := fg.GetAll()
	set := map[string]bool{}
	for name, on := range cfg.FeatureGates {
		if _, ok := known[featuregate.Feature(name)]; ok {
			set[name] = on
		}
	}
	if err := fg.SetFromMap(set); err != nil {
		return nil, fmt.Errorf("logging feature gates: %w", err)
	}
	return fg, nil
}
