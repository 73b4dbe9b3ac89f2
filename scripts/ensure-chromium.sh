#!/usr/bin/env bash
# Make sure headless Chromium is installed for the browser test (tests/services/test_ui_codec.py).
# Debian's package, not a Playwright download: these machines cannot fetch browser builds,
# but they can reach the distribution's mirror. The test fails (never skips) without it.
set -euo pipefail
bin=${FORGE_CHROMIUM:-/usr/bin/chromium}
if [ -x "$bin" ]; then exit 0; fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "$bin is missing and apt-get is not available: install Chromium, or set FORGE_CHROMIUM" >&2
  exit 1
fi
run=()
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1; then run=(sudo); else
    echo "$bin is missing; as root run: apt-get update && apt-get install -y chromium" >&2
    exit 1
  fi
fi
echo "installing chromium (for the Web UI browser test) ..." >&2
"${run[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${run[@]}" apt-get install -y -qq --no-install-recommends chromium >/dev/null
[ -x "$bin" ] || { echo "chromium installed but $bin is missing; set FORGE_CHROMIUM" >&2; exit 1; }
