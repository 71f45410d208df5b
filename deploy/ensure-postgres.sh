#!/usr/bin/env bash
# Installs the Postgres server binaries from Debian packages when they are
# missing. The stack initialises and runs its own cluster in a data folder
# (deploy/localpg); it never uses the system cluster.
set -euo pipefail
if [ -n "${PG_BIN:-}" ] && [ -x "$PG_BIN/initdb" ]; then exit 0; fi
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then exit 0; fi
if command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/initdb" ]; then exit 0; fi
echo "Postgres server binaries not found: installing the Debian package 'postgresql'." >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends postgresql
