-- approvals_work_item (work_item_id, turn DESC) duplicates the unique index
-- of (work_item_id, turn), which serves "the latest approval of an item"
-- by a backward scan. Every approval insert paid for both.
DROP INDEX approvals_work_item;
