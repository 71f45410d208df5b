-- The one-column CHECKs of the turn's tables become domains: the same
-- rule, written once, and cheaper. Postgres reads a table's CHECK
-- expressions back from the catalogue and plans them again for every
-- statement that writes a row, where it keeps a domain's for the life of
-- the connection: the turn's commit takes about 0.9× the time
-- (BenchmarkTurnCommitConstraints, BENCHMARKS.md). The column values do not
-- change (each domain is text), so nothing is rewritten; existing rows are
-- checked against the domain as the columns change type.

CREATE DOMAIN item_status AS text
    CHECK (VALUE IN ('open', 'awaiting_approval', 'escalated', 'halted', 'closed', 'closed_manual'));
CREATE DOMAIN approval_mode AS text CHECK (VALUE IN ('review_app', 'mailbox'));
CREATE DOMAIN action_state AS text
    CHECK (VALUE IN ('pending', 'sent', 'unknown', 'verifying', 'succeeded', 'failed'));
CREATE DOMAIN approval_proof AS text CHECK (VALUE IN ('exact_text', 'proposal_only'));
CREATE DOMAIN approval_status AS text
    CHECK (VALUE IN ('pending', 'approved', 'rejected', 'expired', 'superseded'));
CREATE DOMAIN event_kind AS text
    CHECK (VALUE IN ('approval_decided', 'approval_expired', 'item_halted', 'approval_requested'));

ALTER TABLE work_items
    DROP CONSTRAINT work_items_status_check,
    DROP CONSTRAINT work_items_approval_mode_check,
    DROP CONSTRAINT work_items_action_state_check,
    ALTER COLUMN status TYPE item_status,
    ALTER COLUMN approval_mode TYPE approval_mode,
    ALTER COLUMN action_state TYPE action_state;

ALTER TABLE approvals
    DROP CONSTRAINT approvals_approval_mode_check,
    DROP CONSTRAINT approvals_proof_check,
    DROP CONSTRAINT approvals_status_check,
    ALTER COLUMN approval_mode TYPE approval_mode,
    ALTER COLUMN proof TYPE approval_proof,
    ALTER COLUMN status TYPE approval_status;

ALTER TABLE outbox
    DROP CONSTRAINT outbox_kind_check,
    ALTER COLUMN kind TYPE event_kind;
