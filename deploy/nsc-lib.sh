# shellcheck shell=bash
# Shared by deploy/nsc-brain-account.sh and deploy/nsc-onboard-tenant.sh
# (sourced, not run): reading an account's claims back from nsc.

# account_json prints an account's claims as JSON, with the escapes Go's
# encoder writes for <, > and & undone, so subjects can be searched for as
# they are written.
account_json() {
	nsc describe account --name "$1" --json 2>/dev/null | sed 's/\\u003e/>/g; s/\\u003c/</g; s/\\u0026/\&/g'
}

# has_subject reports whether an account's claims name a subject. The
# claims are read whole before grep looks: with pipefail, grep -q leaving a
# pipe early makes the writer die of SIGPIPE and the pipeline "fail", which
# would read as "no such subject".
has_subject() {
	local claims
	claims=$(account_json "$1")
	grep -qF "\"$2\"" <<<"$claims"
}

# account_key prints an account's public key.
account_key() {
	nsc describe account --name "$1" --field sub | tr -d '"'
}

# revokes_user USER_KEY reports whether the account claims on stdin (JSON,
# as nsc describe account --json prints them) revoke the user: its key, or
# "*" (every user), in the claims' revocations. A revocation covers the JWTs
# issued up to its time, so re-signing a revoked user (nsc edit user) gives
# it a newer JWT the revocation does not cover: it un-revokes the user.
# Revocations map keys to times (no nested objects), so once white space is
# removed the object runs from '"revocations":{' to the first '}'.
revokes_user() {
	local key=$1
	[[ $key =~ ^U[A-Z2-7]{55}$ ]] || return 2
	# Read whole before grep looks: grep -q leaving early would make the
	# writer die of SIGPIPE and, with pipefail, the pipeline read as "not
	# revoked" (see has_subject).
	local claims
	claims=$(tr -d ' \t\r\n')
	grep -qE "\"revocations\":\{[^}]*\"($key|\\*)\":" <<<"$claims"
}

# user_key ACCOUNT USER prints a user's public key.
user_key() {
	nsc describe user --account "$1" --name "$2" --field sub | tr -d '"'
}

# upsert_user ACCOUNT USER NSC_PERMISSION_ARGS... adds the user, or brings
# an existing one's permissions up to date. It refuses a revoked user and
# changes nothing: re-signing it would un-revoke it (see revokes_user).
upsert_user() {
	local account=$1 user=$2 key
	shift 2
	if nsc describe user --account "$account" --name "$user" >/dev/null 2>&1; then
		key=$(user_key "$account" "$user")
		if account_json "$account" | revokes_user "$key"; then
			cat >&2 <<-EOF
				user $user of account $account is revoked (nsc revocations list-users --account $account):
				re-running would sign it a new JWT and so un-revoke it; it is left revoked.
				To give it a new credential, delete the revoked user (the revocation stays in
				the account and keeps refusing the old key), then run this again:
				  nsc delete user --account $account --name $user
			EOF
			return 1
		fi
		nsc edit user --account "$account" --name "$user" "$@"
	else
		nsc add user --account "$account" --name "$user" "$@"
	fi
}

# push_account ACCOUNT WHO pushes the account to the resolver ($PUSH_URL
# when set), or says what to run when $PUSH is not 1 (--no-push).
push_account() {
	if [ "$PUSH" = 1 ]; then
		local push=(nsc push --account "$1")
		if [ -n "$PUSH_URL" ]; then
			push+=(--account-jwt-server-url "$PUSH_URL")
		fi
		"${push[@]}"
	else
		echo "not pushed (--no-push): run 'nsc push --account $1' before $2 connects"
	fi
}

# write_creds ACCOUNT USER FILE writes the user's .creds file, private.
write_creds() {
	(umask 077 && nsc generate creds --account "$1" --name "$2" --output-file "$3")
}

# ensure_signing_key ACCOUNT gives the account a signing key unless it has
# one. Users and activation tokens are then signed with it, so the
# account's identity key can be kept offline; an operator that requires
# signing keys (nsc edit operator --require-signing-keys) issues no user of
# an account without one.
ensure_signing_key() {
	local claims
	claims=$(account_json "$1" | tr -d ' \t\r\n')
	if ! grep -q '"signing_keys":\[' <<<"$claims"; then
		nsc edit account --name "$1" --sk generate
	fi
}
