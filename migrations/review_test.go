package migrations

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"n8nbrain/internal/testdb"
)

// TestReviewMigrationFillsOlderApprovals: approvals written before 0005
// get the assessment of the decision that proposed them and the e-mail's
// sender and subject, so the review page can explain and list them.
func TestReviewMigrationFillsOlderApprovals(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, testdb.AdminURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "mig0005_" + hex.EncodeToString(b)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	cfg := admin.Config().Copy()
	cfg.Database = name
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())

	ms, err := List(Tenant)
	if err != nil {
		t.Fatal(err)
	}
	var review Migration
	for _, m := range ms {
		if m.Version == 5 {
			review = m
			continue
		}
		if m.Version > 5 {
			break
		}
		if _, err := conn.Exec(ctx, m.SQL); err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
	}
	if review.SQL == "" {
		t.Fatal("no migration 0005")
	}
	// An item proposed by a rule, and one whose decision is not JSON.
	_, err = conn.Exec(ctx, `
		INSERT INTO work_items (id, turn, status, catalogue_version, approval_mode, email)
		VALUES ('<a@x>', 1, 'awaiting_approval', 1, 'review_app', '{"from":"Jo <jo@x.example>","subject":"Quote","body":"b"}'),
		       ('<b@x>', 1, 'awaiting_approval', 1, 'review_app', NULL);
		INSERT INTO decisions (work_item_id, turn, fingerprint, turn_seq, status, action, reply) VALUES
		('<a@x>', 1, 'f', 1, 'awaiting_approval', 'draft_reply',
		 convert_to('{"assessment":{"category":"quote_request","priority":"high","confidence":0.95,"source":"rule","rule":"quotes"}}', 'UTF8')),
		('<b@x>', 1, 'f', 2, 'awaiting_approval', 'draft_reply', convert_to('not json, but stored', 'UTF8'));
		INSERT INTO approvals (id, work_item_id, turn, action, catalogue_version, approval_mode, proof, status, proposed, proposed_sha256, expires_at)
		VALUES ('00000000-0000-4000-8000-000000000001', '<a@x>', 1, 'draft_reply', 1, 'review_app', 'exact_text', 'pending', '{}', 'h', now() + interval '1 day');`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, review.SQL); err != nil {
		t.Fatalf("%s: %v", review.Name, err)
	}
	var category, priority, source, rule, from, subject string
	var confidence float64
	var urgency int
	err = conn.QueryRow(ctx, `SELECT category, priority, confidence, assessment_source, assessment_rule, email_from, email_subject, urgency
		FROM approvals`).Scan(&category, &priority, &confidence, &source, &rule, &from, &subject, &urgency)
	if err != nil {
		t.Fatal(err)
	}
	if category != "quote_request" || priority != "high" || confidence != 0.95 || source != "rule" || rule != "quotes" ||
		from != "Jo <jo@x.example>" || subject != "Quote" || urgency != 1 {
		t.Errorf("backfilled %s %s %v %s %s %q %q urgency %d", category, priority, confidence, source, rule, from, subject, urgency)
	}
}
