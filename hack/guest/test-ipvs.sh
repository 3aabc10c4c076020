#!/usr/bin/env bash
# The IPVS mode's kernel tests, and the SCTP scenarios of the other modes, run
# inside the guest by `make test-ipvs`:
#   hack/guest/run.sh -e DSPROXY_REQUIRE_IPVS -e DSPROXY_REQUIRE_SCTP -- hack/guest/test-ipvs.sh BINDIR
# BINDIR holds netns.test (./test/netns), ipvs.test (./pkg/ipvs) and app.test
# (./pkg/app), built with -tags netns on the host, and e2e.test (./test/e2e,
# -tags e2e,netns) with the dsproxy binary it runs; the control plane's binaries
# come from the host's cache (hack/controlplane/build.sh).
set -euo pipefail
bin=$1
root=$(pwd)
cd "$root/test/netns"
# This machine's kernel has no SCTP sockets, so the other modes' SCTP scenarios
# run here, on the guest kernel's SCTP (its TCP and UDP ones run on the host).
"$bin/netns.test" -test.count=1 -test.run '^TestProxierServices$/^(nftables|iptables|iptables-legacy)$/.*/.*/.*/^sctp$'
"$bin/netns.test" -test.count=1 -test.run '^(TestProxierServices|TestProxierEndpointChurn|TestProxierEndpointsReplaced|TestProxierRestartWithoutDrop|TestProxierAffinityScaleDown|TestProxierUDPNewFrontend)$/^ipvs$'
"$bin/netns.test" -test.count=1 -test.v -test.run '^(TestIPVS.*|TestDialSCTPSurvivesLostInit)$'
cd "$root/pkg/ipvs"
"$bin/ipvs.test" -test.count=1 -test.v
cd "$root/pkg/app"
"$bin/app.test" -test.count=1 -test.v -test.run '^(TestCleanupOtherModeIPVS|TestCleanupKubeProxyIPVS|TestInitOnlyIPVS|TestIPVSTimeouts)$'
cd "$root/test/e2e"
DSPROXY_E2E_BIN=$bin/dsproxy "$bin/e2e.test" -test.count=1 -test.v -test.run '^(TestIPVSMode|TestIPVSParity|TestIPVSTakeover)$' -test.timeout 45m
