#!/usr/bin/env bash
# Creates (or brings up to date) the BRAIN account of an nsc operator: the
# production counterpart of nats/account's BrainAccount and RoleBrain.
#
#   * no JetStream of its own: the tenants' streams live in STREAMS
#     (deploy/nsc-streams-account.sh, run first);
#   * the imports of STREAMS' private exports, each with an activation token
#     this script generates from the STREAMS account in the same nsc store:
#     pull and read the turn consumers (under the local prefix streams.api),
#     acknowledge turns, store replies;
#   * the exports tenants import (tenant API and events), public with their
#     account token position, so the server only installs an import whose
#     token is the importing account's own key (DESIGN §3);
#   * the `brain` user: pull, acknowledge, reply, publish events and answer
#     tenant API requests (one response each); no stream or consumer
#     administration, and never a turn or a live reply;
#   * `nsc push` of the account, and the brain user's .creds file.
#
# Run it once per operator, then deploy/nsc-onboard-tenant.sh per tenant with
# the keys this prints. Re-running it is safe: what exists is kept, and a
# revoked brain user is refused, never re-signed (that would un-revoke it;
# see revokes_user in nsc-lib.sh).
#
# The subjects and permissions below must match subjects.BrainExports,
# subjects.BrainImports and account.Permissions(account.RoleBrain);
# deploy/scripts_test.go fails the suite when they drift apart.
set -euo pipefail

# Exports of BRAIN: name|kind|account token position|subject (subjects.BrainExports).
EXPORTS=(
  'api|service|3|brain.api.*.>'
  'events|stream|3|brain.event.*.>'
)
# Imports from STREAMS, all services: name|STREAMS subject|local subject ("" keeps it)
# (subjects.BrainImports).
# shellcheck disable=SC2016 # a NATS subject's $ is literal
IMPORTS=(
  'turn-next|$JS.API.CONSUMER.MSG.NEXT.*.brain|streams.api.CONSUMER.MSG.NEXT.*.brain'
  'turn-info|$JS.API.CONSUMER.INFO.*.brain|streams.api.CONSUMER.INFO.*.brain'
  'turn-ack|$JS.ACK.*.brain.>|'
  'replies|brain.reply.>|'
  'schedules|brain.sched.>|'
)
# The brain user (account.Permissions(account.RoleBrain)).
# shellcheck disable=SC2016 # a NATS subject's $ is literal
BRAIN_ALLOW_PUB=('streams.api.CONSUMER.MSG.NEXT.*.brain' 'streams.api.CONSUMER.INFO.*.brain' '$JS.ACK.*.brain.>' 'brain.reply.>' 'brain.event.*.>' 'brain.sched.>')
BRAIN_DENY_PUB=('brain.turn.*.>' 'brain.live.*.>')
BRAIN_ALLOW_SUB=('_INBOX.>' 'brain.api.*.>')
BRAIN_MAX_RESPONSES=1
BRAIN_USER=brain

usage() {
	cat >&2 <<'EOF'
usage: deploy/nsc-brain-account.sh [options] OPERATOR

Creates the BRAIN account in nsc operator OPERATOR with its imports of the
STREAMS account, its exports and the brain user, pushes it, and writes the
brain user's .creds.

options:
  --account NAME    account name (default BRAIN)
  --streams NAME    the STREAMS account in the same operator (default STREAMS)
  --user NAME       brain user name (default brain); a second name makes a
                    second, overlapping user for a rotation
  --creds FILE      where to write the brain user's .creds (default ./brain.creds)
  --push-url URL    account server for nsc push (default: the operator's)
  --no-push         do not push (an air-gapped store; push later with nsc push)
  -h, --help        this help
EOF
	exit 2
}

die() {
	echo "nsc-brain-account: $*" >&2
	exit 1
}

ACCOUNT=BRAIN
STREAMS=STREAMS
CREDS=./brain.creds
PUSH_URL=
PUSH=1
while [ $# -gt 0 ]; do
	case "$1" in
	--account) [ $# -ge 2 ] || usage; ACCOUNT=$2; shift 2 ;;
	--streams) [ $# -ge 2 ] || usage; STREAMS=$2; shift 2 ;;
	--user) [ $# -ge 2 ] || usage; BRAIN_USER=$2; shift 2 ;;
	--creds) [ $# -ge 2 ] || usage; CREDS=$2; shift 2 ;;
	--push-url) [ $# -ge 2 ] || usage; PUSH_URL=$2; shift 2 ;;
	--no-push) PUSH=0; shift ;;
	-h | --help) usage ;;
	--) shift; break ;;
	-*) echo "nsc-brain-account: unknown option $1" >&2; usage ;;
	*) break ;;
	esac
done
[ $# -eq 1 ] || usage
OPERATOR=$1
[ -n "$OPERATOR" ] || usage
[[ $ACCOUNT =~ ^[A-Za-z0-9_-]{1,64}$ ]] || die "account name '$ACCOUNT' must be letters, digits, _ or -"
[[ $STREAMS =~ ^[A-Za-z0-9_-]{1,64}$ ]] || die "account name '$STREAMS' must be letters, digits, _ or -"
[[ $BRAIN_USER =~ ^[A-Za-z0-9_-]{1,64}$ ]] || die "user name '$BRAIN_USER' must be letters, digits, _ or -"
command -v nsc >/dev/null 2>&1 || die "nsc is not on PATH (https://github.com/nats-io/nsc)"

# shellcheck source=nsc-lib.sh
. "$(dirname "$0")/nsc-lib.sh"

nsc env --operator "$OPERATOR" >/dev/null 2>&1 || die "no nsc operator '$OPERATOR' (nsc list operators)"

nsc describe account --name "$STREAMS" >/dev/null 2>&1 || die "no account '$STREAMS': run deploy/nsc-streams-account.sh first"
if nsc describe account --name "$ACCOUNT" >/dev/null 2>&1; then
	echo "account $ACCOUNT exists; bringing it up to date"
else
	nsc add account --name "$ACCOUNT"
fi
BRAIN_KEY=$(account_key "$ACCOUNT")
STREAMS_KEY=$(account_key "$STREAMS")

for e in "${EXPORTS[@]}"; do
	IFS='|' read -r name kind position subject <<<"$e"
	if has_subject "$ACCOUNT" "$subject"; then
		echo "export $name ($subject) exists"
		continue
	fi
	service=()
	if [ "$kind" = service ]; then
		service=(--service)
	fi
	nsc add export --account "$ACCOUNT" --name "$name" --subject "$subject" \
		--account-token-position "$position" ${service[@]+"${service[@]}"}
done

ensure_signing_key "$ACCOUNT"

tokens=$(mktemp -d)
trap 'rm -rf "$tokens"' EXIT
for i in "${IMPORTS[@]}"; do
	IFS='|' read -r name remote local <<<"$i"
	if has_subject "$ACCOUNT" "$remote"; then
		echo "import $name ($remote) exists"
		continue
	fi
	# STREAMS authorises this one import of BRAIN's, by an activation token.
	nsc generate activation --account "$STREAMS" --target-account "$BRAIN_KEY" \
		--subject "$remote" --output-file "$tokens/$name.jwt"
	local_args=()
	if [ -n "$local" ]; then
		local_args=(--local-subject "$local")
	fi
	nsc add import --account "$ACCOUNT" --name "$name" --token "$tokens/$name.jwt" ${local_args[@]+"${local_args[@]}"}
done

perms=()
for s in "${BRAIN_ALLOW_PUB[@]}"; do perms+=(--allow-pub "$s"); done
for s in "${BRAIN_DENY_PUB[@]}"; do perms+=(--deny-pub "$s"); done
for s in "${BRAIN_ALLOW_SUB[@]}"; do perms+=(--allow-sub "$s"); done
perms+=("--allow-pub-response=$BRAIN_MAX_RESPONSES")
upsert_user "$ACCOUNT" "$BRAIN_USER" "${perms[@]}"
push_account "$ACCOUNT" "the brain"
write_creds "$ACCOUNT" "$BRAIN_USER" "$CREDS"

cat <<EOF

BRAIN account ready: $BRAIN_KEY
  brain user .creds: $CREDS (BRAIN_NATS_CREDS of every brain replica; keep it secret)
Onboard each tenant with:
  deploy/nsc-onboard-tenant.sh TENANT $OPERATOR $BRAIN_KEY $STREAMS_KEY
EOF
