package engine

import (
	"net/mail"
	"strings"

	"n8nbrain/registry"
	"n8nbrain/wire"
)

// matchRule returns the first rule (in position order) whose predicates all
// hold for the email, or nil.
func matchRule(rules []registry.Rule, e *wire.Email) *registry.Rule {
	if e == nil {
		return nil
	}
	addr := senderAddress(e.From)
	_, domain, _ := strings.Cut(addr, "@")
	subject := strings.ToLower(e.Subject)
	body := strings.ToLower(e.Body)
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
