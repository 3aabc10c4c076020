#!/usr/bin/env bash
# kubectl (the cached v1.36 build) against the up.sh control plane, run inside
# the dsproxy-cp netns with the admin kubeconfig. Example:
#   hack/controlplane/kubectl.sh get svc -A
#   hack/controlplane/kubectl.sh apply --dry-run=server -f manifest.yaml
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=hack/controlplane/lib.sh
. "$here/lib.sh"

exec ip netns exec "$CP_NETNS" "$BIN/kubectl" --kubeconfig "$RUN/kubeconfig" "$@"
