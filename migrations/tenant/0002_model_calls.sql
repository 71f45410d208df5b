-- The model-call ledger: one row per call to a model, with token counts and
-- latency. Never prompt text or email content.
CREATE TABLE model_calls (
    id             bigserial PRIMARY KEY,
    tenant_id      text NOT NULL,
    work_item_id   text NOT NULL,
    turn           integer NOT NULL,
    step           text NOT NULL,
    attempt        integer NOT NULL,
    model          text NOT NULL,
    prompt_version text NOT NULL,
    prompt_tokens  integer NOT NULL CHECK (prompt_tokens >= 0),
    output_tokens  integer NOT NULL CHECK (output_tokens >= 0),
    latency_ms     integer NOT NULL CHECK (latency_ms >= 0),
    outcome        text NOT NULL CHECK (outcome IN ('ok', 'invalid_output', 'error', 'timeout')),
    created_at     timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX model_calls_created_at ON model_calls (created_at);
CREATE INDEX model_calls_turn ON model_calls (work_item_id, turn);
