#!/usr/bin/env bash
# Make sure the PostgreSQL server the tests use is up (it is on these machines, but may be stopped).
set -euo pipefail
host=${FORGE_TEST_PG_HOST:-127.0.0.1}
port=${FORGE_TEST_PG_PORT:-5432}
if pg_isready -q -h "$host" -p "$port" 2>/dev/null; then exit 0; fi
if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
  for v in $(ls /etc/postgresql); do
    pg_ctlcluster --skip-systemctl-redirect "$v" main start || true
  done
fi
for _ in $(seq 1 60); do
  pg_isready -q -h "$host" -p "$port" && exit 0
  sleep 0.5
done
echo "PostgreSQL is not reachable at $host:$port; the postgres tests need it" >&2
exit 1
