package config

import (
	"os"
	"testing"
)

// FuzzDecode checks that arbitrary bytes never panic the decoder (strict or
// lenient), that whatever decodes can be validated, and that its encoding
// decodes again.
func FuzzDecode(f *testing.F) {
	for _, path := range []string{"testdata/kube-proxy-v1.36-defaults.yaml"} {
		b, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		"", "{}", "[]", "null", "~", "---\n---", header,
		header + "mode: nftables\nclusterCIDR: 10.244.0.0/16,fd00:10:244::/56\n",
		header + "conntrack: {maxPerCore: null, tcpEstablishedTimeout: 0s}\nlogging: {flushFrequency: 0, vmodule: [{filePattern: a, verbosity: 2}]}\n",
		header + "iptables: {syncPeriod: 1s}\niptables: {}\n",
		`{"apiVersion":"kubeproxy.config.k8s.io/v1alpha1","kind":"KubeProxyConfiguration","logging":{"options":{"text":{"infoBufferSize":"1Ki"}}}}`,
		header + "featureGates: {A: true}\nnodePortAddresses: [primary]\nhealthzBindAddress: \"::\"\n",
		"apiVersion: &a x\nkind: *a\n", "a: !!binary AAAA\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, lenient := range []bool{false, true} {
			c, err := decode(data, lenient, false)
			if err != nil {
				if c != nil {
					t.Fatalf("error %v with non-nil config", err)
				}
				continue
			}
			_ = c.Validate()
			b, err := c.EncodeYAML()
			if err != nil {
				t.Fatalf("encode: %v", err)
			}
			if _, err := Decode(b); err != nil {
				t.Fatalf("re-decode of %q: %v\n%s", data, err, b)
			}
		}
	})
}
