# shellcheck shell=bash
# Shared by deploy/nsc-brain-account.sh and deploy/nsc-onboard-tenant.sh
# (sourced, not run): reading an account's claims back from nsc.

# account_json prints an account's claims as JSON, with the escapes Go's
# encoder writes for <, > and & undone, so subjects can be searched for as
# they are written.
account_json() {
	nsc describe account --name "$1" --json 2>/dev/null | sed 's/\\u003e/>/g; s/\\u003c/</g; s/\\u0026/\&/g'
}

# has_subject reports whether an account's claims name a subject.
has_subject() {
	account_json "$1" | grep -qF "\"$2\""
}

# account_key prints an account's public key.
account_key() {
	nsc describe account --name "$1" --field sub | tr -d '"'
}
