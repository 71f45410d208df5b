#!/bin/sh
# The local postgres image's entrypoint: the part of the official image's
# docker-entrypoint.sh that compose.yaml relies on. On an empty PGDATA it
# initialises a cluster whose superuser POSTGRES_USER (postgres) has
# POSTGRES_PASSWORD (UTF8, POSTGRES_INITDB_ARGS), creates POSTGRES_DB, runs
# /docker-entrypoint-initdb.d/*.sh and *.sql against a server that listens on
# its socket only; then it runs the server as the postgres user.
set -eu
if [ "${1:-postgres}" != postgres ]; then
  exec "$@"
fi
[ $# -gt 0 ] && shift
if [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA"
  chown postgres:postgres "$PGDATA"
  chmod 0700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" postgres "$@"
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "postgres: POSTGRES_PASSWORD is not set; the superuser needs a password" >&2
    exit 1
  fi
  export POSTGRES_USER="${POSTGRES_USER:-postgres}"
  export POSTGRES_DB="${POSTGRES_DB:-$POSTGRES_USER}"
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  # UTF8, as the official image's (its locale is en_US.utf8; C.UTF-8 needs
  # no locale package). POSTGRES_INITDB_ARGS adds to it, as there.
  # shellcheck disable=SC2086
  initdb -D "$PGDATA" --username="$POSTGRES_USER" --pwfile="$pwfile" \
    --encoding=UTF8 --locale=C.UTF-8 --auth-local=trust --auth-host=scram-sha-256 \
    ${POSTGRES_INITDB_ARGS:-} >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  pg_ctl -D "$PGDATA" -w -o "-c listen_addresses=''" start >/dev/null
  if [ "$POSTGRES_DB" != postgres ]; then
    psql -v ON_ERROR_STOP=1 --username="$POSTGRES_USER" --dbname=postgres \
      -v db="$POSTGRES_DB" -c 'CREATE DATABASE :"db"'
  fi
  for f in /docker-entrypoint-initdb.d/*; do
    case "$f" in
      *.sh) echo "postgres: running $f"; sh "$f" ;;
      *.sql) echo "postgres: running $f"; psql -v ON_ERROR_STOP=1 --username="$POSTGRES_USER" --dbname="$POSTGRES_DB" -f "$f" ;;
      *) ;;
    esac
  done
  pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  echo "postgres: initialised $PGDATA"
fi
exec postgres -D "$PGDATA" "$@"
