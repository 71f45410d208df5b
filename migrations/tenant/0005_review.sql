-- What a reviewer needs to decide an approval, kept on the approval record
-- itself so that it explains itself: the assessment when the action was
-- proposed (category, priority, confidence, and whether a rule, named, or
-- the model decided) and the e-mail's sender and subject (to list, sort and
-- search approvals without reading every work item).

ALTER TABLE approvals
    ADD COLUMN category          text,
    ADD COLUMN priority          text,
    ADD COLUMN confidence        double precision,
    ADD COLUMN assessment_source text,
    ADD COLUMN assessment_rule   text,
    ADD COLUMN email_from        text,
    ADD COLUMN email_subject     text,
    -- Urgency orders the review queue: urgent first; no priority last.
    ADD COLUMN urgency smallint GENERATED ALWAYS AS (CASE priority
        WHEN 'urgent' THEN 0 WHEN 'high' THEN 1 WHEN 'normal' THEN 2 WHEN 'low' THEN 3 ELSE 4 END) STORED;

-- Records written before: the assessment of the decision that proposed the
-- approval (its stored reply), the e-mail of its work item.
UPDATE approvals a SET
    category          = d.assessment ->> 'category',
    priority          = d.assessment ->> 'priority',
    confidence        = (d.assessment ->> 'confidence')::double precision,
    assessment_source = d.assessment ->> 'source',
    assessment_rule   = NULLIF(d.assessment ->> 'rule', '')
FROM (SELECT d.work_item_id, d.turn, convert_from(d.reply, 'UTF8')::jsonb -> 'assessment' AS assessment
      FROM decisions d JOIN approvals p ON p.work_item_id = d.work_item_id AND p.turn = d.turn) d
WHERE d.work_item_id = a.work_item_id AND d.turn = a.turn AND jsonb_typeof(d.assessment) = 'object';

UPDATE approvals a SET email_from = w.email ->> 'from', email_subject = w.email ->> 'subject'
FROM work_items w
WHERE w.id = a.work_item_id AND w.email IS NOT NULL;

-- The review queue: pending by urgency then age; the rest by decision time.
CREATE INDEX approvals_pending_queue ON approvals (urgency, created_at, id) WHERE status = 'pending';
CREATE INDEX approvals_decided ON approvals (status, decided_at DESC, id DESC) WHERE status <> 'pending';
