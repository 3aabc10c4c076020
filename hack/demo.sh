#!/usr/bin/env bash
# The local demo on a real control plane. It needs the daemon and the control-plane
# scripts of issue 4; until they land it says so.
set -euo pipefail
echo "dsproxy demo: the control-plane demo is not implemented yet (issue 4)." >&2
exit 1
