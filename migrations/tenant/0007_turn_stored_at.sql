-- When the turn message a decision answers was stored in its stream. With
-- the stream sequence it identifies the message even across a recreated
-- stream (whose sequences start again at 1): a redelivery of the very
-- message a decision answered gets its original bytes; any other message
-- with the same turn key is a replay. NULL for decisions made before.
ALTER TABLE decisions ADD COLUMN turn_stored_at timestamptz;
