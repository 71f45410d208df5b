-- Token counts are bigint: a server reporting more than 2^31 tokens made
-- the ledger insert fail after the call was paid for (the brain also clamps
-- each count to model.MaxCallTokens before it is used). Latency stays
-- integer milliseconds (the brain clamps it too).
ALTER TABLE model_calls
    ALTER COLUMN prompt_tokens TYPE bigint,
    ALTER COLUMN output_tokens TYPE bigint;

-- call_id identifies one HTTP call to the model. The brain checkpoints a
-- step's answer with the calls it cost before it writes them here, and
-- writes them again from the checkpoint after a failure: the unique index
-- makes that write idempotent, so a paid call is recorded exactly once and
-- never paid again. Rows from before this migration have none.
ALTER TABLE model_calls ADD COLUMN call_id uuid;
CREATE UNIQUE INDEX model_calls_call_id ON model_calls (call_id);
