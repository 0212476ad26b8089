#!/usr/bin/env bash
# Run a command with a throwaway PostgreSQL on 127.0.0.1, for the tracking-server tests:
#   bash tests/with-postgres.sh .venv/bin/python -m pytest -m cluster
# Installs Debian's postgresql when its binaries are missing, starts a fresh cluster in a temporary
# folder on a free local port (trust auth: it listens on loopback only and is deleted afterwards),
# exports GTEP_TEST_POSTGRES_URI, runs the command and stops the cluster whatever happens.
set -euo pipefail

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1 || true)
if [ -z "$pg_bin" ] || [ ! -x "$pg_bin/initdb" ]; then
    echo "with-postgres: installing postgresql from Debian's packages" >&2
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq postgresql >/dev/null
    pg_bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n1)
fi

# PostgreSQL refuses to run as root: use its own system user then.
run_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

data=$(mktemp -d /tmp/gtep-pg.XXXXXX)
[ "$(id -u)" = 0 ] && chown postgres "$data"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cleanup() {
    run_pg "$pg_bin/pg_ctl" -D "$data/db" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$data"
}
trap cleanup EXIT

run_pg "$pg_bin/initdb" -D "$data/db" -U postgres --auth=trust >/dev/null
run_pg "$pg_bin/pg_ctl" -D "$data/db" -l "$data/server.log" -w \
    -o "-p $port -k $data -c listen_addresses=127.0.0.1" start >/dev/null
run_pg "$pg_bin/createdb" -h 127.0.0.1 -p "$port" -U postgres mlflow

export GTEP_TEST_POSTGRES_URI="postgresql://postgres@127.0.0.1:$port/mlflow"
echo "with-postgres: PostgreSQL on 127.0.0.1:$port" >&2
"$@"
