-- Approvals and the outbox. An approval is a stop, not a wait: the human's
-- decision is written here and an outbox event restarts n8n.

CREATE TABLE approvals (
    id                uuid PRIMARY KEY,
    work_item_id      text NOT NULL REFERENCES work_items (id),
    turn              integer NOT NULL,
    action            text NOT NULL,
    catalogue_version integer NOT NULL,
    approval_mode     text NOT NULL CHECK (approval_mode IN ('review_app', 'mailbox')),
    proof             text NOT NULL CHECK (proof IN ('exact_text', 'proposal_only')),
    status            text NOT NULL CHECK (status IN ('pending', 'approved', 'rejected', 'expired', 'superseded')),
    -- The exact content proposed and its SHA-256; an edit is stored beside
    -- it with its own hash, so the record keeps both. json, not jsonb: the
    -- hash is over these exact bytes (canonical: keys sorted), and jsonb
    -- would reorder them.
    proposed          json NOT NULL,
    proposed_sha256   text NOT NULL,
    edited            json,
    edited_sha256     text,
    approved_sha256   text,
    expires_at        timestamptz NOT NULL,
    decided_by        text,
    decided_at        timestamptz,
    reject_reason     text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    UNIQUE (work_item_id, turn),
    CHECK ((status = 'approved') = (approved_sha256 IS NOT NULL)),
    CHECK (status = 'pending' OR decided_at IS NOT NULL)
);

CREATE INDEX approvals_pending_expiry ON approvals (expires_at) WHERE status = 'pending';
CREATE INDEX approvals_work_item ON approvals (work_item_id, turn DESC);

-- Events n8n must hear about, written in the same transaction as the change
-- and forwarded until the edge reports n8n accepted them.
CREATE TABLE outbox (
    id              uuid PRIMARY KEY,
    kind            text NOT NULL CHECK (kind IN ('approval_decided', 'approval_expired', 'item_halted')),
    work_item_id    text NOT NULL,
    payload         jsonb NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    published_at    timestamptz,
    delivered_at    timestamptz
);

CREATE INDEX outbox_due ON outbox (next_attempt_at) WHERE delivered_at IS NULL;
