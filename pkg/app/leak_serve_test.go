package app

import (
	"context"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// shutdownListener makes the listening socket on port fail its accepts
// (EINVAL), as a listener broken under the server does.
func shutdownListener(t *testing.T, port int) bool {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip(err)
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		sa, err := unix.Getsockname(fd)
		if err != nil {
			continue
		}
		if in, ok := sa.(*unix.SockaddrInet4); ok && in.Port == port {
			if v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err == nil && v == 1 {
				return unix.Shutdown(fd, unix.SHUT_RD) == nil
			}
		}
	}
	return false
}

// TestLeakServeHTTPRetry: a failure of the metrics or healthz server that
// serveHTTP retries leaves no goroutine behind (one waited to close the failed
// server until the daemon stopped).
func TestLeakServeHTTPRetry(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	defer func(d time.Duration) { serveRetry = d }(serveRetry)
	serveRetry = 50 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go serveHTTP(ctx, "test", "127.0.0.1:"+strconv.Itoa(port), http.NotFoundHandler(), nil)
	time.Sleep(200 * time.Millisecond)
	base := runtime.NumGoroutine()
	for i := range 2 {
		if !shutdownListener(t, port) {
			t.Fatalf("failure %d: listener not found", i)
		}
		time.Sleep(300 * time.Millisecond) // past serveHTTP's retry delay
	}
	if g := runtime.NumGoroutine(); g > base {
		t.Errorf("after 2 retried server failures: %d goroutines, %d before", g, base)
	}
}
