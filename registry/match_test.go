package registry

import "testing"

func TestFirstMatch(t *testing.T) {
	t.Parallel()
	rules := []Rule{
		{Name: "domain", Match: Match{SenderDomains: []string{"acme.example"}}},
		{Name: "address-and-subject", Match: Match{SenderAddresses: []string{"Boss@Corp.example"}, SubjectKeywords: []string{"urgent"}}},
		{Name: "body", Match: Match{BodyKeywords: []string{"refund"}}},
	}
	tests := []struct {
		name                string
		from, subject, body string
		want                string
	}{
		{"Domain", "Jo <jo@acme.example>", "", "", "domain"},
		{"Subdomain", "jo@mail.acme.example", "", "", "domain"},
		{"LookalikeDomain", "jo@notacme.example", "", "", ""},
		{"AllPredicatesMustHold", "boss@corp.example", "hello", "", ""},
		{"CaseInsensitive", "BOSS@corp.example", "URGENT: call me", "", "address-and-subject"},
		{"Body", "x@y.example", "", "I want a Refund now", "body"},
		{"FirstMatchWins", "jo@acme.example", "", "refund", "domain"},
		{"None", "x@y.example", "hi", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := FirstMatch(rules, tt.from, tt.subject, tt.body)
			if (got == nil && tt.want != "") || (got != nil && got.Name != tt.want) {
				t.Fatalf("matched %v, want %q", got, tt.want)
			}
		})
	}
	if FirstMatch([]Rule{{Name: "empty"}}, "a@b", "", "") != nil {
		t.Fatal("a rule without predicates matched")
	}
}
