-- Per-tenant bounds on the shared brain (the tenant-isolation issue). The
-- provisioning tooling creates each tenant's streams from these columns:
-- turn_quota_msgs and turn_quota_bytes bound the turns in the tenant's
-- stream within turn_window_seconds (its MaxAge), and max_inflight caps the
-- tenant's turns in flight across brain replicas (its consumer's
-- MaxAckPending). The brain tells the tenant's edge these numbers when it
-- refuses a turn over quota.
ALTER TABLE tenants
    ADD COLUMN turn_quota_msgs     bigint  NOT NULL DEFAULT 10000
        CHECK (turn_quota_msgs BETWEEN 10 AND 100000000),
    ADD COLUMN turn_quota_bytes    bigint  NOT NULL DEFAULT 67108864
        CHECK (turn_quota_bytes BETWEEN 1048576 AND 1099511627776),
    ADD COLUMN turn_window_seconds integer NOT NULL DEFAULT 3600
        CHECK (turn_window_seconds BETWEEN 60 AND 604800),
    ADD COLUMN max_inflight        integer NOT NULL DEFAULT 16
        CHECK (max_inflight BETWEEN 1 AND 1024);
