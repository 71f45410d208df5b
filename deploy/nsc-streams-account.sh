#!/usr/bin/env bash
# Creates (or brings up to date) the STREAMS account of an nsc operator: the
# production counterpart of nats/account's StreamsAccount and RoleProvisioner.
#
#   * JetStream enabled: every tenant's streams (TURNS_<account> and
#     RESULTS_<account>) and consumers live here, and nothing else;
#   * the public exports tenants import, each with its account token
#     position, so the server installs no import that names another
#     tenant's key (DESIGN §3);
#   * the private exports only the BRAIN account imports, with activation
#     tokens (deploy/nsc-brain-account.sh): pull and read the turn
#     consumers, acknowledge turns, store replies, set timers (message
#     schedules in SCHEDULES). Nothing that creates,
#     changes or deletes a stream or a consumer;
#   * the `provisioner` user, the ops tooling's identity for creating and
#     deleting tenants' streams (never a runtime credential);
#   * `nsc push` of the account, and the provisioner's .creds file.
#
# Run it once per operator, then deploy/nsc-brain-account.sh with the
# STREAMS public key this prints. Re-running it is safe: what exists is kept.
#
# The subjects and permissions below must match subjects.StreamsExports and
# account.Permissions(account.RoleProvisioner); deploy/scripts_test.go
# fails the suite when they drift apart.
set -euo pipefail

# Exports of STREAMS: name|kind|account token position (0: private)|response|subject
# (subjects.StreamsExports; response "stream" is a service answered many times).
# shellcheck disable=SC2016 # a NATS subject's $ is literal
EXPORTS=(
  'turns|service|3|single|brain.turn.*.>'
  'replies|stream|3|single|brain.live.*.>'
  'results|service|8|single|$JS.API.DIRECT.GET.*.brain.reply.*.>'
  'turn-next|service|0|stream|$JS.API.CONSUMER.MSG.NEXT.*.brain'
  'turn-info|service|0|single|$JS.API.CONSUMER.INFO.*.brain'
  'turn-ack|service|0|single|$JS.ACK.*.brain.>'
  'reply-store|service|0|single|brain.reply.>'
  'schedule-store|service|0|single|brain.sched.>'
)
# How long a streamed response's way back is kept without traffic.
RESPONSE_THRESHOLD=2m
# The provisioner user (account.Permissions(account.RoleProvisioner)).
# shellcheck disable=SC2016 # a NATS subject's $ is literal
PROVISIONER_ALLOW_PUB=('$JS.API.>')
PROVISIONER_ALLOW_SUB=('_INBOX.>')
PROVISIONER_USER=provisioner

usage() {
	cat >&2 <<'EOF'
usage: deploy/nsc-streams-account.sh [options] OPERATOR

Creates the STREAMS account in nsc operator OPERATOR with JetStream, its
exports and the provisioner user, pushes it, and writes the provisioner's
.creds.

options:
  --account NAME    account name (default STREAMS)
  --user NAME       provisioner user name (default provisioner); a second
                    name makes a second, overlapping user for a rotation
  --creds FILE      where to write the provisioner's .creds (default ./provisioner.creds)
  --push-url URL    account server for nsc push (default: the operator's)
  --no-push         do not push (an air-gapped store; push later with nsc push)
  -h, --help        this help
EOF
	exit 2
}

die() {
	echo "nsc-streams-account: $*" >&2
	exit 1
}

ACCOUNT=STREAMS
CREDS=./provisioner.creds
PUSH_URL=
PUSH=1
while [ $# -gt 0 ]; do
	case "$1" in
	--account) [ $# -ge 2 ] || usage; ACCOUNT=$2; shift 2 ;;
	--user) [ $# -ge 2 ] || usage; PROVISIONER_USER=$2; shift 2 ;;
	--creds) [ $# -ge 2 ] || usage; CREDS=$2; shift 2 ;;
	--push-url) [ $# -ge 2 ] || usage; PUSH_URL=$2; shift 2 ;;
	--no-push) PUSH=0; shift ;;
	-h | --help) usage ;;
	--) shift; break ;;
	-*) echo "nsc-streams-account: unknown option $1" >&2; usage ;;
	*) break ;;
	esac
done
[ $# -eq 1 ] || usage
OPERATOR=$1
[ -n "$OPERATOR" ] || usage
[[ $ACCOUNT =~ ^[A-Za-z0-9_-]{1,64}$ ]] || die "account name '$ACCOUNT' must be letters, digits, _ or -"
[[ $PROVISIONER_USER =~ ^[A-Za-z0-9_-]{1,64}$ ]] || die "user name '$PROVISIONER_USER' must be letters, digits, _ or -"
command -v nsc >/dev/null 2>&1 || die "nsc is not on PATH (https://github.com/nats-io/nsc)"

# shellcheck source=nsc-lib.sh
. "$(dirname "$0")/nsc-lib.sh"

nsc env --operator "$OPERATOR" >/dev/null 2>&1 || die "no nsc operator '$OPERATOR' (nsc list operators)"

if nsc describe account --name "$ACCOUNT" >/dev/null 2>&1; then
	echo "account $ACCOUNT exists; bringing it up to date"
else
	nsc add account --name "$ACCOUNT"
fi

# JetStream, unlimited within the server's own limits (as account.StreamsAccount).
nsc edit account --name "$ACCOUNT" \
	--js-mem-storage=-1 --js-disk-storage=-1 --js-streams=-1 --js-consumer=-1

for e in "${EXPORTS[@]}"; do
	IFS='|' read -r name kind position response subject <<<"$e"
	if has_subject "$ACCOUNT" "$subject"; then
		echo "export $name ($subject) exists"
		continue
	fi
	args=(--account "$ACCOUNT" --name "$name" --subject "$subject")
	if [ "$kind" = service ]; then
		args+=(--service)
	fi
	if [ "$position" = 0 ]; then
		args+=(--private)
	else
		args+=(--account-token-position "$position")
	fi
	if [ "$response" = stream ]; then
		args+=(--response-type Stream --response-threshold "$RESPONSE_THRESHOLD")
	fi
	nsc add export "${args[@]}"
done

ensure_signing_key "$ACCOUNT"

perms=()
for s in "${PROVISIONER_ALLOW_PUB[@]}"; do perms+=(--allow-pub "$s"); done
for s in "${PROVISIONER_ALLOW_SUB[@]}"; do perms+=(--allow-sub "$s"); done
upsert_user "$ACCOUNT" "$PROVISIONER_USER" "${perms[@]}"
push_account "$ACCOUNT" "the provisioner"
write_creds "$ACCOUNT" "$PROVISIONER_USER" "$CREDS"

cat <<EOF

STREAMS account ready: $(account_key "$ACCOUNT")
  provisioner .creds: $CREDS (the admin tooling's NATS identity; keep it secret, never on a brain)
Next:
  deploy/nsc-brain-account.sh $OPERATOR   (imports from $ACCOUNT)
EOF
