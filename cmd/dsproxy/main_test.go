package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The tests run main in a child process (this test binary, re-executed): the
// logging configuration is process-wide and main exits.
const childEnv = "DSPROXY_MAIN_TEST_ARGS"

func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(childEnv); ok {
		os.Args = append([]string{"dsproxy"}, strings.Split(args, "\n")...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runMain runs dsproxy with args and returns its stdout and stderr.
func runMain(t *testing.T, args ...string) (stdout, stderr string) {
	t.Helper()
	stdout, stderr, err := runMainStatus(args...)
	if err != nil {
		t.Fatalf("dsproxy %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, stdout, stderr)
	}
	return stdout, stderr
}

// runMainStatus runs dsproxy with args and returns its output and exit status.
func runMainStatus(args ...string) (stdout, stderr string, err error) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"="+strings.Join(args, "\n"))
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// jsonMessages parses every line of s as a JSON log entry and returns their
// "msg" fields; a line that is not one fails the test.
func jsonMessages(t *testing.T, s string) []string {
	t.Helper()
	var msgs []string
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		if line == "" {
			continue
		}
		var e struct {
			TS  *float64 `json:"ts"`
			Msg string   `json:"msg"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil || e.Msg == "" || e.TS == nil {
			t.Fatalf("not a JSON log entry: %q (%v)", line, err)
		}
		msgs = append(msgs, e.Msg)
	}
	return msgs
}

// wantMessages: the two messages --write-config-to logs without a cluster CIDR.
var wantMessages = []string{"Configuration warning", "Wrote configuration"}

func sameMessages(a, b []string) bool {
	return strings.Join(a, "\n") == strings.Join(b, "\n")
}

// TestLoggingFormatJSON: --logging-format=json and a file's logging.format: json
// log JSON entries (to stderr unless split), as kube-proxy, which registers the
// format; before, dsproxy refused both ("Unsupported log format").
func TestLoggingFormatJSON(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "written.yaml")

	t.Run("flag", func(t *testing.T) {
		stdout, stderr := runMain(t, "--logging-format=json", "--write-config-to="+out)
		if stdout != "" {
			t.Errorf("stdout: %q, want nothing (one stream, stderr)", stdout)
		}
		if got := jsonMessages(t, stderr); !sameMessages(got, wantMessages) {
			t.Errorf("messages %q, want %q", got, wantMessages)
		}
		written, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(written), "format: json") {
			t.Errorf("written configuration has no \"format: json\":\n%s", written)
		}
	})

	t.Run("file", func(t *testing.T) {
		file := filepath.Join(dir, "config.yaml")
		conf := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nlogging:\n  format: json\n"
		if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		_, stderr := runMain(t, "--config="+file, "--write-config-to="+out)
		if got := jsonMessages(t, stderr); !sameMessages(got, wantMessages) {
			t.Errorf("messages %q, want %q", got, wantMessages)
		}
	})

	t.Run("text stays klog's", func(t *testing.T) {
		_, stderr := runMain(t, "--write-config-to="+out)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		if len(lines) != len(wantMessages) {
			t.Fatalf("stderr %q, want %d lines", stderr, len(wantMessages))
		}
		for i, line := range lines {
			if !strings.HasPrefix(line, "I") || !strings.Contains(line, `"`+wantMessages[i]+`"`) {
				t.Errorf("line %q, want a klog info line with %q", line, wantMessages[i])
			}
		}
	})
}

// TestBufferedLogsFlushed: with split streams and an info buffer, the info
// entries still buffered when dsproxy exits are written (main flushes klog).
func TestBufferedLogsFlushed(t *testing.T) {
	out := filepath.Join(t.TempDir(), "written.yaml")
	for _, format := range []string{"json", "text"} {
		t.Run(format, func(t *testing.T) {
			stdout, _ := runMain(t, "--feature-gates=LoggingAlphaOptions=true", "--logging-format="+format,
				"--log-"+format+"-split-stream", "--log-"+format+"-info-buffer-size=1Mi", "--write-config-to="+out)
			var got []string
			if format == "json" {
				got = jsonMessages(t, stdout)
			} else {
				for _, m := range wantMessages {
					if strings.Contains(stdout, `"`+m+`"`) {
						got = append(got, m)
					}
				}
			}
			if !sameMessages(got, wantMessages) {
				t.Errorf("stdout has %q, want %q; stdout:\n%s", got, wantMessages, stdout)
			}
		})
	}
}

// TestExitReason: once the log format is applied, the reason dsproxy exits is
// a log entry in that format (kube-proxy's "command failed" with the error), a
// configuration that does not validate included, as kube-proxy applies its log
// format first; before, as for a flag that does not parse, it is printed as is.
// The runs fail before they touch the kernel (no kubeconfig; bad values).
func TestExitReason(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-kubeconfig")
	for _, tc := range []struct {
		name string
		args []string
		want func(t *testing.T, stderr string)
	}{
		{"json", []string{"--logging-format=json", "--kubeconfig=" + missing}, func(t *testing.T, stderr string) {
			msgs := jsonMessages(t, stderr)
			if len(msgs) == 0 || msgs[len(msgs)-1] != "command failed" || !strings.Contains(stderr, `"err":"API client configuration: `) {
				t.Errorf("stderr %q: want a last JSON entry \"command failed\" with the error", stderr)
			}
		}},
		{"text", []string{"--kubeconfig=" + missing}, func(t *testing.T, stderr string) {
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			last := lines[len(lines)-1]
			if !strings.HasPrefix(last, "E") || !strings.Contains(last, `"command failed" err="API client configuration: `) {
				t.Errorf("last line %q: want a klog error \"command failed\" with the error", last)
			}
		}},
		{"invalid configuration, as kube-proxy's", []string{"--logging-format=json", "--oom-score-adj=5000"}, func(t *testing.T, stderr string) {
			msgs := jsonMessages(t, stderr)
			if len(msgs) == 0 || msgs[len(msgs)-1] != "command failed" || !strings.Contains(stderr, `"err":"invalid configuration:\noomScoreAdj`) {
				t.Errorf("stderr %q: want a last JSON entry \"command failed\" with the validation error", stderr)
			}
		}},
		{"before logging", []string{"--logging-format=json", "--no-such-flag"}, func(t *testing.T, stderr string) {
			if !strings.HasPrefix(stderr, "dsproxy: unknown flag: --no-such-flag") {
				t.Errorf("stderr %q: want the flag error as is", stderr)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, err := runMainStatus(tc.args...)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("exit %v, want status 1; stderr:\n%s", err, stderr)
			}
			tc.want(t, stderr)
		})
	}
}

// TestFlagLines: with -v 1 or more, every flag is logged with its value, as
// kube-proxy's "FLAG: --name=value" lines; below, none.
func TestFlagLines(t *testing.T) {
	out := filepath.Join(t.TempDir(), "written.yaml")
	_, stderr := runMain(t, "--v=1", "--proxy-mode=iptables", "--write-config-to="+out)
	for _, want := range []string{`] FLAG: --proxy-mode="iptables"` + "\n", `] FLAG: --v="1"` + "\n", `] FLAG: --masquerade-all="false"` + "\n", `] FLAG: --node-ip=""` + "\n"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("no %q in the log:\n%s", want, stderr)
		}
	}
	if _, stderr := runMain(t, "--proxy-mode=iptables", "--write-config-to="+out); strings.Contains(stderr, "FLAG:") {
		t.Errorf("FLAG lines at -v 0:\n%s", stderr)
	}
}
