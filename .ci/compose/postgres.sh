#!/bin/sh
# CI's stand-in for the official postgres image's entrypoint (docker-compose.ci.yml): Debian's
# PostgreSQL 15 with the same environment (POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB) and
# data folder, listening on the compose network with password authentication.
set -eu
bin=/usr/lib/postgresql/15/bin
data=/var/lib/postgresql/data
mkdir -p "$data" /var/run/postgresql
chown postgres:postgres "$data" /var/run/postgresql
chmod 700 "$data"
if [ ! -s "$data/PG_VERSION" ]; then
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  chown postgres "$pwfile"
  su postgres -s /bin/sh -c "$bin/initdb -D $data -U $POSTGRES_USER --pwfile=$pwfile \
    --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8" >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$data/pg_hba.conf"
  # Single-user mode: the database exists before the server listens for anyone.
  echo "CREATE DATABASE \"$POSTGRES_DB\" OWNER \"$POSTGRES_USER\";" |
    su postgres -s /bin/sh -c "$bin/postgres --single -D $data postgres" >/dev/null
fi
exec su postgres -s /bin/sh -c "exec $bin/postgres -D $data -c listen_addresses='*'"
