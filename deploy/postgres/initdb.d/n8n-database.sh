#!/bin/sh
# n8n's database in the stack's Postgres (compose.yaml, service postgres):
# a login role `n8n` with N8N_DB_PASSWORD that owns database `n8n` and
# nothing else; no other role may connect to it. The postgres image runs
# this once, when it initialises an empty data volume, against a server
# listening on its socket only (a changed N8N_DB_PASSWORD therefore needs
# ALTER ROLE n8n PASSWORD, or a fresh volume).
set -eu
if [ -z "${N8N_DB_PASSWORD:-}" ]; then
  echo "n8n-database: N8N_DB_PASSWORD is not set" >&2
  exit 1
fi
psql -v ON_ERROR_STOP=1 --username "${POSTGRES_USER:-postgres}" --dbname postgres \
  -v pw="$N8N_DB_PASSWORD" <<'SQL'
CREATE ROLE n8n LOGIN PASSWORD :'pw';
CREATE DATABASE n8n OWNER n8n;
REVOKE ALL ON DATABASE n8n FROM PUBLIC;
GRANT CONNECT, TEMPORARY ON DATABASE n8n TO n8n;
SQL
