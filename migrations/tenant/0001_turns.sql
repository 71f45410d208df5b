-- A tenant's own database. The brain reaches it with the tenant's login
-- role, which may read and write rows but owns nothing and runs no DDL.

CREATE TABLE work_items (
    id                text PRIMARY KEY,
    turn              integer NOT NULL CHECK (turn >= 0), -- last decided turn
    status            text NOT NULL CHECK (status IN
                        ('open', 'awaiting_approval', 'escalated', 'halted', 'closed', 'closed_manual')),
    status_reason     text,
    needs_human       boolean NOT NULL DEFAULT false,
    category          text,
    priority          text,
    confidence        double precision,
    assessment_source text,
    catalogue_version integer NOT NULL,
    approval_mode     text NOT NULL CHECK (approval_mode IN ('review_app', 'mailbox')),
    email             jsonb,
    -- The action the last turn proposed and where it stands:
    -- pending (awaiting approval) → sent (handed to n8n) → unknown → verifying → succeeded | failed.
    last_action       text,
    last_action_params jsonb,
    action_state      text CHECK (action_state IN ('pending', 'sent', 'unknown', 'verifying', 'succeeded', 'failed')),
    -- How the item ended: succeeded, failed, closed_manual, expired, halted.
    outcome           text,
    human_action      jsonb,
    closed_at         timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX work_items_needs_human ON work_items (updated_at) WHERE needs_human;

-- One decision per (work item, turn): the unique key is the final guard of
-- idempotency. reply holds the exact bytes sent, replayed verbatim.
CREATE TABLE decisions (
    work_item_id text NOT NULL REFERENCES work_items (id),
    turn         integer NOT NULL CHECK (turn >= 1),
    fingerprint  text NOT NULL,
    turn_seq     bigint NOT NULL,
    status       text NOT NULL,
    action       text,
    reply        bytea NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (work_item_id, turn)
);

-- Decisions are a record: nobody updates or deletes them, whatever the grants.
CREATE FUNCTION forbid_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% on % is not allowed: the table is append-only', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END;
$$;

CREATE TRIGGER decisions_append_only BEFORE UPDATE OR DELETE ON decisions
    FOR EACH ROW EXECUTE FUNCTION forbid_change();

-- Finished engine steps of a turn; a re-driven turn resumes from here.
CREATE TABLE step_checkpoints (
    work_item_id text NOT NULL,
    turn         integer NOT NULL,
    step         text NOT NULL,
    output       jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (work_item_id, turn, step)
);
