package capture

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"n8nbrain/catalogue"
	"n8nbrain/registry"
	"n8nbrain/wire"
)

// promptFingerprints pins each prompt version to the text and schema it
// stands for. Eval reports and autonomy grants are bound to the prompt
// versions (registry.DecisionConfig), so a prompt changed under the same
// version would carry old evidence over to a new prompt. When this test
// fails, bump the version in registry (PromptClassify, PromptDraft) and
// record the new fingerprint here.
var promptFingerprints = map[string]string{
	PromptClassify: "550a9a51af003bb2b150098b0887ed63c71eb12fbfa690978f36fd76552af46c",
	PromptDraft:    "8988d5756c0172d0da9347ffb10fd145fdf59dfab9cb8efbd5db2d48a1dffcfd",
}

func TestPromptsArePinnedToTheirVersions(t *testing.T) {
	t.Parallel()
	tn := &registry.Tenant{ID: "pin", CatalogueVersion: 1, Categories: []string{"quote_request", "complaint", "booking", "invoice", "general"},
		EnabledActions: []catalogue.Name{catalogue.DraftReply, catalogue.CreateJob, catalogue.EscalateItem, catalogue.CloseItem}}
	e := &wire.Email{From: "Jo <jo@customer.example>", To: []string{"office@example.com"}, Subject: "Quote", Body: "Please quote for a deck."}
	acts := choices(tn, 1)
	sys, user := classifyMessages(tn, e, acts)
	draft, _ := catalogue.Lookup(1, catalogue.DraftReply)
	dsys, duser := draftMessages(e, draft, "quote_request", "high")
	fp := func(parts ...string) string {
		h := sha256.New()
		for _, p := range parts {
			h.Write([]byte(p))
			h.Write([]byte{0})
		}
		return hex.EncodeToString(h.Sum(nil))
	}
	got := map[string]string{
		PromptClassify: fp(sys, user, string(classifySchema(tn, acts))),
		PromptDraft:    fp(dsys, duser, string(draftSchema(draft))),
	}
	for v, want := range promptFingerprints {
		if got[v] != want {
			t.Errorf("prompt %s now has fingerprint %s, pinned %s: a changed prompt is a new version (bump it in registry and pin the new fingerprint)", v, got[v], want)
		}
	}
}
