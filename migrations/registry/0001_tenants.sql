-- The registry: one row per tenant, written by the ops tooling only. The
-- brain reads it through a role that can only SELECT.

CREATE TABLE tenants (
    id                   text PRIMARY KEY CHECK (id ~ '^[a-z0-9][a-z0-9-]{0,47}$'),
    nats_account         text NOT NULL UNIQUE CHECK (nats_account ~ '^A[A-Z2-7]{55}$'),
    status               text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'disabled')),
    -- Connection details of the tenant's own database and login role. The
    -- password is sealed (AES-256-GCM, tenant id as additional data) with a
    -- key only the brain and the ops tool hold; never stored in plain text.
    db_host              text NOT NULL,
    db_port              integer NOT NULL CHECK (db_port BETWEEN 1 AND 65535),
    db_name              text NOT NULL,
    db_user              text NOT NULL,
    db_password_sealed   bytea NOT NULL,
    turn_ceiling         integer NOT NULL DEFAULT 8 CHECK (turn_ceiling BETWEEN 1 AND 1000),
    approval_mode        text NOT NULL DEFAULT 'review_app' CHECK (approval_mode IN ('review_app', 'mailbox')),
    approval_ttl_seconds integer NOT NULL DEFAULT 259200 CHECK (approval_ttl_seconds > 0),
    catalogue_version    integer NOT NULL DEFAULT 1,
    enabled_actions      text[] NOT NULL DEFAULT '{}',
    categories           text[] NOT NULL DEFAULT '{quote_request,complaint,booking,invoice,general}',
    model_name           text NOT NULL DEFAULT '',
    model_options        jsonb NOT NULL DEFAULT '{}',
    daily_token_budget   bigint NOT NULL DEFAULT 0 CHECK (daily_token_budget >= 0),
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now()
);

-- Deterministic triage rules: structured predicates, no expression language.
-- match is an object such as {"sender_domains": ["acme.example"],
-- "subject_keywords": ["quote"]}; the brain decodes it strictly.
CREATE TABLE triage_rules (
    tenant_id  text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    position   integer NOT NULL,
    name       text NOT NULL,
    match      jsonb NOT NULL,
    category   text NOT NULL,
    priority   text NOT NULL,
    action     text,
    params     jsonb NOT NULL DEFAULT '{}',
    confidence double precision NOT NULL DEFAULT 1 CHECK (confidence >= 0 AND confidence <= 1),
    PRIMARY KEY (tenant_id, position),
    UNIQUE (tenant_id, name)
);

-- Brain replicas LISTEN on registry_changed and reload the tenant named in
-- the payload, so a change applies within moments without a restart.
CREATE FUNCTION registry_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'tenants' THEN
        PERFORM pg_notify('registry_changed', COALESCE(NEW.id, OLD.id));
    ELSE
        PERFORM pg_notify('registry_changed', COALESCE(NEW.tenant_id, OLD.tenant_id));
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER tenants_notify AFTER INSERT OR UPDATE OR DELETE ON tenants
    FOR EACH ROW EXECUTE FUNCTION registry_notify();
CREATE TRIGGER triage_rules_notify AFTER INSERT OR UPDATE OR DELETE ON triage_rules
    FOR EACH ROW EXECUTE FUNCTION registry_notify();
