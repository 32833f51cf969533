#!/usr/bin/env bash
# Install Debian's headless-capable chromium for the browser tests of the HTML audit report.
# Idempotent: does nothing when /usr/bin/chromium already exists. Never downloads a browser
# build of its own (only Debian's package), so it works where only package registries are reachable.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
    echo "chromium already installed: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
/usr/bin/chromium --version
