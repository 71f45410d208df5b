-- The autonomy gate (issue 14): a tenant's autonomy may go beyond assist
-- only on evidence. eval_reports holds scored eval reports (brain-eval), each
-- for one decision configuration of the tenant (config_hash: model, model
-- options, prompt versions, catalogue version, enabled actions, categories,
-- rules; registry.DecisionConfig). autonomy_grants lists the (action,
-- category) pairs a tenant at autonomy 'auto' lets the model carry out
-- without a human, each resting on one stored report; autonomy_thresholds
-- are the operator's minimum scores (defaults in registry when no row).
-- The ops tooling writes these tables after checking the evidence
-- (provision.SetAutonomy); the brain re-checks it at every decision and
-- applies assist when the tenant's configuration no longer matches the
-- report's or its scores no longer pass.

CREATE TABLE eval_reports (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id    text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    config_hash  text NOT NULL CHECK (config_hash ~ '^[0-9a-f]{64}$'),
    set_hash     text NOT NULL CHECK (set_hash ~ '^[0-9a-f]{64}$'),
    model        text NOT NULL,
    tool_version text NOT NULL,
    -- The gate's scores (registry.EvalScores), derived from report.
    scores       jsonb NOT NULL,
    report       jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX eval_reports_tenant_config ON eval_reports (tenant_id, config_hash, id DESC);

CREATE TABLE autonomy_thresholds (
    tenant_id              text PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    min_items              integer NOT NULL CHECK (min_items >= 1),
    min_decisions          integer NOT NULL CHECK (min_decisions >= 1),
    min_category_recall    double precision NOT NULL CHECK (min_category_recall BETWEEN 0 AND 1),
    min_category_precision double precision NOT NULL CHECK (min_category_precision BETWEEN 0 AND 1),
    min_action_precision   double precision NOT NULL CHECK (min_action_precision BETWEEN 0 AND 1),
    min_valid_output_rate  double precision NOT NULL CHECK (min_valid_output_rate BETWEEN 0 AND 1),
    max_forbidden_rate     double precision NOT NULL CHECK (max_forbidden_rate BETWEEN 0 AND 1),
    updated_at             timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE autonomy_grants (
    tenant_id  text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    action     text NOT NULL,
    category   text NOT NULL,
    -- The evidence; a report a grant rests on cannot be deleted.
    report_id  bigint NOT NULL REFERENCES eval_reports (id),
    granted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, action, category)
);

-- A change reaches the brains as any registry change does (registry_notify
-- names the tenant from tenant_id).
CREATE TRIGGER autonomy_thresholds_notify AFTER INSERT OR UPDATE OR DELETE ON autonomy_thresholds
    FOR EACH ROW EXECUTE FUNCTION registry_notify();
CREATE TRIGGER autonomy_grants_notify AFTER INSERT OR UPDATE OR DELETE ON autonomy_grants
    FOR EACH ROW EXECUTE FUNCTION registry_notify();
