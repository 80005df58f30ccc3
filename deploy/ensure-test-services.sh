#!/usr/bin/env bash
# Installs the real peers the test-suite starts on loopback (Prometheus, etcd and etcdctl from
# Debian), Chromium (from Debian too) for the dashboard tests, and nftables, whose rules the
# multi-host test (`make e2e-hosts`) loads inside its own network namespaces only.
# Tests start and stop the servers themselves, by PID; this only makes sure the binaries exist.
# Debian's packages would start system daemons on install; a policy-rc.d that refuses every
# start keeps them from running at all, so nothing has to be stopped (never by name).
set -euo pipefail

install_debian() {
    local policy=/usr/sbin/policy-rc.d created=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        created=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null || status=$?
    if [ "$created" = 1 ]; then rm -f "$policy"; fi
    return "${status:-0}"
}

missing=()
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v nft >/dev/null 2>&1 || missing+=(nftables)
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" = "0" ]; then
        install_debian "${missing[@]}"
    else
        echo "not root, cannot install: ${missing[*]}; tests that need them are skipped" >&2
    fi
fi
