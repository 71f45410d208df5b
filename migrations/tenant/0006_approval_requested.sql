-- approval_requested: written with the approval record, so n8n can notify
-- reviewers that a draft waits for them. The outbox's kind list grows by one.

ALTER TABLE outbox DROP CONSTRAINT outbox_kind_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_kind_check
    CHECK (kind IN ('approval_decided', 'approval_expired', 'item_halted', 'approval_requested'));
