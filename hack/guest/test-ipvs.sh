#!/usr/bin/env bash
# The IPVS mode's kernel tests, run inside the guest by `make test-ipvs`:
#   hack/guest/run.sh -e DSPROXY_REQUIRE_IPVS -- hack/guest/test-ipvs.sh BINDIR
# BINDIR holds netns.test (./test/netns) and app.test (./pkg/app), built with
# -tags netns on the host.
set -euo pipefail
bin=$1
root=$(pwd)
cd "$root/test/netns"
"$bin/netns.test" -test.count=1 -test.run '^(TestProxierServices|TestProxierEndpointChurn|TestProxierRestartWithoutDrop)$/^ipvs$'
"$bin/netns.test" -test.count=1 -test.v -test.run '^TestIPVS'
cd "$root/pkg/app"
"$bin/app.test" -test.count=1 -test.v -test.run '^TestCleanupOtherModeIPVS$'
