package devstack

import (
	"encoding/json"

	"n8nbrain/catalogue"
	"n8nbrain/provision"
	"n8nbrain/registry"
)

// ClientZeroSpec is the development tenant: email triage in assist mode,
// every v1 action enabled, and a few rules that show the deterministic stage.
func ClientZeroSpec() provision.TenantSpec {
	return provision.TenantSpec{
		ID:             "client-zero",
		TurnCeiling:    8,
		ApprovalMode:   registry.ApprovalModeReviewApp,
		EnabledActions: []catalogue.Name{catalogue.DraftReply, catalogue.SendReply, catalogue.CreateJob, catalogue.EscalateItem, catalogue.CloseItem, catalogue.VerifyReplySent, catalogue.VerifyJob},
		Rules: []registry.Rule{
			{
				Name:       "quote-requests",
				Match:      registry.Match{SubjectKeywords: []string{"quote", "quotation", "estimate"}},
				Category:   "quote_request",
				Priority:   "high",
				Action:     catalogue.DraftReply,
				Params:     json.RawMessage(`{"subject":"Re: your quote request","body":"Thanks for getting in touch. We are preparing your quote and will send it within two working days.","tone":"friendly"}`),
				Confidence: 0.9,
			},
			{
				Name:       "invoices",
				Match:      registry.Match{SubjectKeywords: []string{"invoice", "remittance"}},
				Category:   "invoice",
				Priority:   "normal",
				Action:     catalogue.CloseItem,
				Params:     json.RawMessage(`{"resolution":"invoices are handled by accounts"}`),
				Confidence: 0.9,
			},
			{
				Name:       "complaints",
				Match:      registry.Match{BodyKeywords: []string{"complaint", "refund", "unacceptable"}},
				Category:   "complaint",
				Priority:   "urgent",
				Action:     catalogue.EscalateItem,
				Params:     json.RawMessage(`{"reason":"complaint: a person replies"}`),
				Confidence: 0.9,
			},
		},
	}
}
