#!/usr/bin/env bash
# Make sure the system tools the tests need are installed (the suite fails, never
# skips, without them): openssl (test_security's throwaway PKI) and pg_isready.
set -euo pipefail
missing=()
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v pg_isready >/dev/null 2>&1 || missing+=(postgresql-client)
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
echo "installing ${missing[*]} for the tests" >&2
if command -v apt-get >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get install -y -q "${missing[@]}" >/dev/null || {
    $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q "${missing[@]}" >/dev/null
  }
fi
for tool in openssl pg_isready; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "$tool is missing and could not be installed; the tests need it" >&2
    exit 1
  }
done
