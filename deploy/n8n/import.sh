#!/bin/sh
# Imports n8nbrain into n8n and publishes it: the credentials and settings
# that `devstack init` (compose) or `devstack up` (make dev) wrote into DIR,
# then the shipped workflows, unchanged. Run it with the n8n CLI on PATH and
# n8n's own environment (database, N8N_ENCRYPTION_KEY), while n8n is stopped
# (n8n reads published workflows when it starts).
#
#   deploy/n8n/import.sh DIR [imap] [webhook]
#
# imap publishes the mailbox assistant (its IMAP triggers need the mailbox
# reachable when n8n starts), webhook the webhook intake; the sub-workflows
# and the events webhook are always published. Default: webhook.
set -eu
if [ $# -lt 1 ] || [ ! -f "$1/credentials.json" ] || [ ! -f "$1/settings.json" ]; then
  echo "usage: $0 DIR [imap] [webhook]   (DIR holds credentials.json and settings.json)" >&2
  exit 2
fi
dir=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
publish="n8nbrainSettings n8nbrainTurn n8nbrainAct n8nbrainEvents"
[ $# -eq 0 ] && set -- webhook
for v in "$@"; do
  case $v in
    imap) publish="$publish n8nbrainImap" ;;
    webhook) publish="$publish n8nbrainIntake" ;;
    *) echo "$0: unknown variant $v (imap, webhook)" >&2; exit 2 ;;
  esac
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$here"/workflows/*.json "$dir/settings.json" "$tmp/"
n8n import:credentials --input="$dir/credentials.json"
n8n import:workflow --separate --input="$tmp"
# One CLI start per workflow (n8n has no publish-all): run them together.
pids=""
for id in $publish; do
  n8n publish:workflow --id="$id" >"$tmp/publish-$id.log" 2>&1 &
  pids="$pids $!"
done
failed=0
for p in $pids; do wait "$p" || failed=1; done
if [ $failed -ne 0 ]; then
  cat "$tmp"/publish-*.log >&2
  echo "$0: publishing failed" >&2
  exit 1
fi
echo "n8nbrain: imported and published:$publish"
