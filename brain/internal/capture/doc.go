// Package capture is the model stage of the Capture engine (engine.Model):
// it classifies a new work item with the model (category, priority,
// confidence, and the next action from the tenant's enabled actions), then
// drafts the reply when that action is draft_reply. Every e-mail field shown
// to the model is bounded; every answer is decoded strictly against the
// JSON schema the model was given and validated against the catalogue and
// the tenant's configuration; an invalid answer gets one repair naming every
// problem, then the item goes to a human. Each answer is checkpointed with
// the calls it cost before anything else can fail, every call is written to
// the ledger (idempotently, by call id), each call's estimated cost is
// checked against what is left of the tenant's daily token budget before it
// is made, and a model that is down or over budget escalates the item with
// the reason: never a silent fallback. What the stage proposes still passes
// the engine's gate, which applies the tenant's autonomy.
package capture
