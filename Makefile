# dsproxy build and test entry points. `make test` is what CI runs (.ci/run).
# Go's install directory, for a fresh machine's shell that lacks it.
export PATH := $(PATH):/usr/local/go/bin
GO        ?= go
STATICCHECK ?= $(shell PATH='$(PATH)' $(GO) env GOPATH)/bin/staticcheck
PKGS      := ./...
BIN       := bin

.PHONY: all build test test-unit test-netns test-ipvs test-e2e fuzz-smoke bench bench-kernel bench-iptables bench-e2e bench-smoke lint deps demo clean

all: build

build:
	$(GO) build -o $(BIN)/dsproxy ./cmd/dsproxy

# Everything CI checks, after installing what it needs (deps): lint, unit tests
# with the race detector, fuzz smoke runs, benchmark smoke runs, the root-only
# kernel tests in network namespaces, the IPVS mode's and SCTP's kernel tests in
# a qemu guest, and the end-to-end tests on a real control plane.
test: deps lint test-unit fuzz-smoke bench-smoke test-netns test-ipvs test-e2e

test-unit:
	$(GO) test -race -count=1 $(PKGS)

# Root-only tests: each creates its own network namespaces and removes them.
test-netns:
	$(GO) test -count=1 -tags netns -p 1 ./test/netns/... ./pkg/... ./bench/...

# The IPVS mode's kernel tests. This kernel has no IPVS, so they run in a qemu
# guest booted with Debian's kernel (hack/guest), where a missing IPVS fails
# rather than skips: the netns scenarios, and the real binary in IPVS mode on the
# real control plane, all inside the guest. The guest kernel has SCTP sockets,
# which this one lacks: the other modes' SCTP scenarios run there too. The test
# binaries are built here; the guest sees this machine's filesystem.
GUESTBIN := $(CURDIR)/$(BIN)/guest
test-ipvs:
	hack/controlplane/build.sh
	mkdir -p $(GUESTBIN)
	$(GO) test -c -tags netns -o $(GUESTBIN)/netns.test ./test/netns/
	$(GO) test -c -tags netns -o $(GUESTBIN)/app.test ./pkg/app/
	$(GO) test -c -tags netns -o $(GUESTBIN)/ipvs.test ./pkg/ipvs/
	$(GO) test -c -tags e2e,netns -o $(GUESTBIN)/e2e.test ./test/e2e/
	$(GO) build -o $(GUESTBIN)/dsproxy ./cmd/dsproxy
	DSPROXY_REQUIRE_IPVS=1 DSPROXY_REQUIRE_SCTP=1 hack/guest/run.sh -m 4096 -e DSPROXY_REQUIRE_IPVS -e DSPROXY_REQUIRE_SCTP -- hack/guest/test-ipvs.sh $(GUESTBIN)

# End-to-end: a real etcd + kube-apiserver + kube-controller-manager (built once
# from the Go module proxy and cached) in a network namespace, dsproxy in another.
test-e2e:
	hack/controlplane/build.sh
	hack/kubegates/gen.sh --check
	$(GO) test -count=1 -tags e2e,netns -p 1 -timeout 20m ./test/e2e/...
	$(GO) test -count=1 -tags e2e,netns -run '^(TestConnectTimes|TestParseStatTicks|TestTreeCPUTicksCountsRunningDescendants|TestPlotLines|TestConnectFloor|TestLoadCount|TestMergeCountSpread|TestTargets|TestRenderAgain|TestInformersSynced|TestParseSchedStat|TestPollFirst|TestRuns|TestParseAPIW3Metrics|TestCPUGroup|TestAwaitEarlierLoads|TestEventControlPlaneSched|TestRatioSameMode|TestEtcdLoad)$$' ./bench/e2e/

FUZZTIME ?= 10s
FUZZ_TARGETS := ./pkg/endpointslice:FuzzIngest ./pkg/model:FuzzServicePorts \
	./pkg/nodeip:FuzzParseNodeIP ./pkg/nodeport:FuzzRegistry ./pkg/nodeip:FuzzSelect ./pkg/config:FuzzDecode \
	./pkg/kubeclient:FuzzDecodeEndpointSlice ./pkg/kubeclient:FuzzDecodeService

# Go 1.26's fuzzing can fail a target with a bare "context deadline exceeded" as
# -fuzztime runs out (golang/go#75804, fixed in Go 1.27): such a run, and only
# such a run (no failing input written), is tried again, up to three runs in
# all. A real finding fails at once: it is written to testdata/fuzz and would
# fail every later run as a seed anyway.
fuzz-smoke:
	@out=$$(mktemp); trap 'rm -f "$$out"' EXIT; \
	for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; \
		for try in 1 2 3; do \
			echo "fuzz $$pkg $$fn (run $$try)"; \
			if $(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) $$pkg >"$$out" 2>&1; then cat "$$out"; break; fi; \
			cat "$$out"; \
			if [ $$try = 3 ] || ! grep -q 'context deadline exceeded' "$$out" || grep -q 'Failing input written' "$$out"; then exit 1; fi; \
			echo "fuzz $$pkg $$fn: the deadline failure of golang/go#75804; once more"; \
		done; \
	done

bench-smoke:
	$(GO) test -run '^$$' -bench . -benchtime 1x ./bench/... ./pkg/...

# Real-kernel figures (root): cold start, one-endpoint and one-service
# transactions, first-packet latency, at 1k/10k/30k dual-stack Services.
bench-kernel:
	DSPROXY_BENCH_SIZES=$${DSPROXY_BENCH_SIZES:-1000,10000,30000} $(GO) test -tags netns -run TestKernelFigures -v -count=1 -timeout 30m ./bench/

# The iptables backend on the real kernel (root): cold start, partial and full
# syncs, connect cost through a ClusterIP.
bench-iptables:
	DSPROXY_BENCH_SIZES=$${DSPROXY_BENCH_SIZES:-1000,10000} $(GO) test -tags netns -run TestIPTablesFigures -v -count=1 -timeout 60m ./bench/

# Side by side with kube-proxy v1.36 (nftables and iptables modes) on the real
# control plane: table, JSON and PNG in bench/e2e/out. SERVICES=1000,10000 for more.
SERVICES ?= 1000
bench-e2e:
	hack/controlplane/build.sh
	$(GO) test -tags e2e,netns -run TestBenchE2E -v -count=1 -timeout 120m ./bench/e2e/ -args -services=$(SERVICES) $(BENCH_E2E_ARGS)

bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 5x ./bench/... ./pkg/...

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	$(GO) vet $(PKGS)
	$(GO) vet -tags netns $(PKGS)
	$(GO) vet -tags e2e,netns $(PKGS)
	$(STATICCHECK) $(PKGS)
	$(STATICCHECK) -tags netns $(PKGS)
	$(STATICCHECK) -tags e2e,netns $(PKGS)

deps:
	hack/install-deps.sh

demo: build
	hack/demo.sh

clean:
	rm -rf $(BIN)
