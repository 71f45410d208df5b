// Package capture is the model stage of the Capture engine (engine.Model):
// it classifies a new work item with the model (category, priority,
// confidence, and the next action from the tenant's enabled actions), then
// drafts the reply when that action is draft_reply. Every answer is decoded
// strictly against the JSON schema the model was given and validated
// against the catalogue and the tenant's configuration; an invalid answer
// gets one repair, then the item goes to a human. Each finished step is
// checkpointed, every call is written to the ledger, the tenant's daily
// token budget is checked before each call, and a model that is down or
// over budget escalates the item with the reason: never a silent fallback.
package capture
