package registry

import (
	"net/mail"
	"strings"
)

// ConfidentRule is the rule confidence at and above which a matching rule
// decides alone: below it, the model decides when the brain has one.
const ConfidentRule = 0.8

// FirstMatch returns the first rule (in order) whose predicates all hold for
// an e-mail, or nil. It is the one matcher: the brain's engine triages with
// it and the ops tool's dry run (brainctl rules test) shows its answer.
func FirstMatch(rules []Rule, from, subject, body string) *Rule {
	addr := senderAddress(from)
	_, domain, _ := strings.Cut(addr, "@")
	subject = strings.ToLower(subject)
	body = strings.ToLower(body)
	for i := range rules {
		r := &rules[i]
		m := r.Match
		if m.Empty() {
			continue // a rule without predicates would match everything; provisioning refuses it
		}
		if len(m.SenderDomains) > 0 && !anyFunc(m.SenderDomains, func(d string) bool { return domainMatches(domain, d) }) {
			continue
		}
		if len(m.SenderAddresses) > 0 && !anyFunc(m.SenderAddresses, func(a string) bool { return strings.EqualFold(strings.TrimSpace(a), addr) }) {
			continue
		}
		if len(m.SubjectKeywords) > 0 && !anyFunc(m.SubjectKeywords, func(k string) bool { return containsKeyword(subject, k) }) {
			continue
		}
		if len(m.BodyKeywords) > 0 && !anyFunc(m.BodyKeywords, func(k string) bool { return containsKeyword(body, k) }) {
			continue
		}
		return r
	}
	return nil
}

// senderAddress extracts the lowercase address from a From header value;
// an unparsable value yields the trimmed, lowercased input.
func senderAddress(from string) string {
	if a, err := mail.ParseAddress(from); err == nil {
		return strings.ToLower(a.Address)
	}
	return strings.ToLower(strings.TrimSpace(from))
}

// domainMatches: the sender's domain equals the rule's or is a subdomain of it.
func domainMatches(domain, rule string) bool {
	rule = strings.ToLower(strings.TrimPrefix(strings.TrimSpace(rule), "@"))
	if rule == "" || domain == "" {
		return false
	}
	return domain == rule || strings.HasSuffix(domain, "."+rule)
}

func containsKeyword(text, kw string) bool {
	kw = strings.ToLower(strings.TrimSpace(kw))
	return kw != "" && strings.Contains(text, kw)
}

func anyFunc(xs []string, f func(string) bool) bool {
	for _, x := range xs {
		if f(x) {
			return true
		}
	}
	return false
}
