#!/usr/bin/env bash
# Installs the real peers the test-suite starts on loopback (Prometheus from Debian).
# Tests start and stop the servers themselves; this only makes sure the binaries exist.
set -euo pipefail
if ! command -v prometheus >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ]; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq --no-install-recommends prometheus >/dev/null
        # Debian's package starts a system Prometheus on :9090; tests run their own.
        (service prometheus stop || pkill -x prometheus || true) >/dev/null 2>&1
    else
        echo "prometheus not installed and not root: Prometheus tests will be skipped" >&2
    fi
fi
