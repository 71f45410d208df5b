#!/usr/bin/env bash
# Onboards a tenant in an nsc operator: the production counterpart of
# nats/account's TenantAccount and RoleEdge.
#
#   * the tenant's account, importing the STREAMS and BRAIN accounts' exports
#     with the tenant's own account key in the account token position: the
#     server installs no import that names another tenant's key (DESIGN §3);
#   * the account's bounds: a payload limit (a turn, headers included: the
#     server refuses anything larger), connections and subscriptions;
#   * the `edge` user: publish turns, request results and API calls,
#     subscribe to replies, events and its inboxes; nothing else;
#   * `nsc push` of the account, and the edge user's .creds file.
#
# The tenant's identity is its account: the brain reads the account key the
# server writes into each subject. Register the printed account key with the
# tenant (brainctl tenant create --account), and give the .creds file to the
# tenant's edge (EDGE_NATS_CREDS). Re-running it is safe: what exists is kept,
# and a revoked edge user is refused, never re-signed (that would un-revoke
# it; see revokes_user in nsc-lib.sh).
#
# The subjects and permissions below must match subjects.TenantImports and
# account.Permissions(account.RoleEdge); deploy/scripts_test.go fails the
# suite when they drift apart.
set -euo pipefail

# Imports: name|exporting account (streams or brain)|kind|subject ({ACC} is the
# tenant's own key)|local subject (subjects.TenantImports).
# shellcheck disable=SC2016 # a NATS subject's $ is literal
IMPORTS=(
  'turns|streams|service|brain.turn.{ACC}.>|turn.>'
  'replies|streams|stream|brain.live.{ACC}.>|reply.>'
  'results|streams|service|$JS.API.DIRECT.GET.RESULTS_{ACC}.brain.reply.{ACC}.>|result.>'
  'api|brain|service|brain.api.{ACC}.>|api.>'
  'events|brain|stream|brain.event.{ACC}.>|event.>'
)
# The edge user (account.Permissions(account.RoleEdge)).
EDGE_ALLOW_PUB=('turn.>' 'result.>' 'api.>')
EDGE_ALLOW_SUB=('reply.>' 'event.>' '_INBOX.>')
EDGE_USER=edge
# Bounds of the tenant account (account.TenantAccount, account.Tenant*).
TENANT_MAX_CONNS=32
TENANT_MAX_PAYLOAD=262144
TENANT_MAX_SUBS=1000

usage() {
	cat >&2 <<'EOF'
usage: deploy/nsc-onboard-tenant.sh [options] TENANT OPERATOR BRAIN_ACCOUNT_KEY STREAMS_ACCOUNT_KEY

Creates account TENANT in nsc operator OPERATOR, importing the BRAIN and
STREAMS accounts (public keys printed by deploy/nsc-brain-account.sh), with
an edge user; pushes it and writes the edge user's .creds.

TENANT is the tenant id: lowercase letters, digits and -, as in the registry.

options:
  --user NAME       edge user name (default edge); a second name makes a
                    second, overlapping user for a rotation
  --creds FILE      where to write the edge user's .creds (default ./TENANT-USER.creds)
  --push-url URL    account server for nsc push (default: the operator's)
  --no-push         do not push (push later with nsc push)
  -h, --help        this help
EOF
	exit 2
}

die() {
	echo "nsc-onboard-tenant: $*" >&2
	exit 1
}

CREDS=
PUSH_URL=
PUSH=1
while [ $# -gt 0 ]; do
	case "$1" in
	--user) [ $# -ge 2 ] || usage; EDGE_USER=$2; shift 2 ;;
	--creds) [ $# -ge 2 ] || usage; CREDS=$2; shift 2 ;;
	--push-url) [ $# -ge 2 ] || usage; PUSH_URL=$2; shift 2 ;;
	--no-push) PUSH=0; shift ;;
	-h | --help) usage ;;
	--) shift; break ;;
	-*) echo "nsc-onboard-tenant: unknown option $1" >&2; usage ;;
	*) break ;;
	esac
done
[ $# -eq 4 ] || usage
TENANT=$1
OPERATOR=$2
BRAIN=$3
STREAMS=$4
[[ $TENANT =~ ^[a-z0-9][a-z0-9-]{0,47}$ ]] || die "tenant '$TENANT' must match ^[a-z0-9][a-z0-9-]{0,47}\$ (the registry's tenant id)"
[ -n "$OPERATOR" ] || usage
for key in "$BRAIN" "$STREAMS"; do
	[[ $key =~ ^A[A-Z2-7]{55}$ ]] || die "'$key' is not an account public key (A followed by 55 base32 characters)"
done
[ "$BRAIN" != "$STREAMS" ] || die "the BRAIN and STREAMS keys are the same key"
[[ $EDGE_USER =~ ^[A-Za-z0-9_-]{1,64}$ ]] || die "user name '$EDGE_USER' must be letters, digits, _ or -"
CREDS=${CREDS:-./$TENANT-$EDGE_USER.creds}
command -v nsc >/dev/null 2>&1 || die "nsc is not on PATH (https://github.com/nats-io/nsc)"

# shellcheck source=nsc-lib.sh
. "$(dirname "$0")/nsc-lib.sh"

nsc env --operator "$OPERATOR" >/dev/null 2>&1 || die "no nsc operator '$OPERATOR' (nsc list operators)"

if nsc describe account --name "$TENANT" >/dev/null 2>&1; then
	echo "account $TENANT exists; bringing it up to date"
else
	nsc add account --name "$TENANT"
fi
ACC=$(account_key "$TENANT")
[[ $ACC =~ ^A[A-Z2-7]{55}$ ]] || die "could not read the public key of account $TENANT"
[ "$ACC" != "$BRAIN" ] || die "account $TENANT is the BRAIN account"
[ "$ACC" != "$STREAMS" ] || die "account $TENANT is the STREAMS account"

nsc edit account --name "$TENANT" --conns "$TENANT_MAX_CONNS" --payload "$TENANT_MAX_PAYLOAD" --subscriptions "$TENANT_MAX_SUBS"

for i in "${IMPORTS[@]}"; do
	IFS='|' read -r name from kind remote local <<<"$i"
	remote=${remote//\{ACC\}/$ACC}
	src=$BRAIN
	if [ "$from" = streams ]; then
		src=$STREAMS
	fi
	if has_subject "$TENANT" "$remote"; then
		echo "import $name ($remote) exists"
		continue
	fi
	service=()
	if [ "$kind" = service ]; then
		service=(--service)
	fi
	nsc add import --account "$TENANT" --name "$name" --src-account "$src" \
		--remote-subject "$remote" --local-subject "$local" ${service[@]+"${service[@]}"}
done

ensure_signing_key "$TENANT"

perms=()
for s in "${EDGE_ALLOW_PUB[@]}"; do perms+=(--allow-pub "$s"); done
for s in "${EDGE_ALLOW_SUB[@]}"; do perms+=(--allow-sub "$s"); done
upsert_user "$TENANT" "$EDGE_USER" "${perms[@]}"
push_account "$TENANT" "the edge"
write_creds "$TENANT" "$EDGE_USER" "$CREDS"

cat <<EOF

Tenant $TENANT onboarded.
  NATS account: $ACC
    register it with the tenant: brainctl tenant create $TENANT --account $ACC
  edge user .creds: $CREDS
    the tenant's edge reads it (EDGE_NATS_CREDS); hand it over securely
EOF
