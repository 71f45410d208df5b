-- Autonomy: how far the brain may act on what a model chose. "assist" (the
-- only level so far, and every tenant's default): every action the model
-- stage chooses stops for a human's approval; only deterministic rules act
-- without one. The allowed values are listed once, in Go
-- (registry.Autonomies), and checked by the ops tooling before a row is
-- written; the brain treats any value it does not know as assist.
ALTER TABLE tenants ADD COLUMN autonomy text NOT NULL DEFAULT 'assist';
