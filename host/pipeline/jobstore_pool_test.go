package pipeline

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/state"
)

// testS3URL returns an s3:// URL under a fresh prefix of the server scripts/s3-up.sh started
// (skipped without one, failed under CI).
func testS3URL(t *testing.T) string {
	t.Helper()
	ep := os.Getenv("CLINK_TEST_S3_ENDPOINT")
	if ep == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("S3 tests need CLINK_TEST_S3_ENDPOINT (scripts/with-s3.sh)")
		}
		t.Skip("S3 tests need a server: scripts/with-s3.sh go test ...")
	}
	bucket := os.Getenv("CLINK_TEST_S3_BUCKET")
	if bucket == "" {
		bucket = "clink-test"
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "s3://" + bucket + "/t/" + strings.ReplaceAll(t.Name(), "/", "_") + "-" + hex.EncodeToString(b) +
		"?endpoint=" + url.QueryEscape(ep) + "&path_style=true"
}

// TestPoolRecordsOnS3: checkpoint records on s3:// are create-once (a second writer of the
// same id fails, even with other content), attempts are numbered without gaps, and a missing
// record is ErrNoCheckpoint.
func TestPoolRecordsOnS3(t *testing.T) {
	u := testS3URL(t)
	ctx := context.Background()
	st, err := state.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rs, err := openJobRecords(st, u, "", "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := rs.(*poolRecords); !ok {
		t.Fatalf("s3:// records are %T, want *poolRecords", rs)
	}
	for want := uint64(1); want <= 3; want++ {
		n, err := rs.ClaimAttempt(ctx)
		if err != nil || n != want {
			t.Fatalf("attempt %d: got %d, %v", want, n, err)
		}
	}
	rec := &CheckpointRecord{Format: RecordFormat, Job: "job", ID: 7, Attempt: 1, KeyGroups: 8}
	if err := rs.Put(ctx, kindCommitted, rec); err != nil {
		t.Fatal(err)
	}
	if err := rs.Put(ctx, kindCommitted, rec); err != nil {
		t.Fatalf("the same bytes again (a retried PUT that landed) must succeed: %v", err)
	}
	zombie := *rec
	zombie.Attempt = 2
	if err := rs.Put(ctx, kindCommitted, &zombie); !errors.Is(err, ErrRecordExists) {
		t.Fatalf("a second writer of record 7: %v, want ErrRecordExists", err)
	}
	got, err := rs.Get(ctx, kindCommitted, 7)
	if err != nil || got.Attempt != 1 {
		t.Fatalf("record 7: %+v, %v (want attempt 1's)", got, err)
	}
	if _, err := rs.Get(ctx, kindCommitted, 8); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("missing record: %v", err)
	}
	rec2 := *rec
	rec2.ID = 12
	if err := rs.Put(ctx, kindCommitted, &rec2); err != nil {
		t.Fatal(err)
	}
	if err := rs.Put(ctx, kindPrepared, &rec2); err != nil {
		t.Fatal(err)
	}
	ids, err := rs.List(ctx, kindCommitted)
	if err != nil || len(ids) != 2 || ids[0] != 7 || ids[1] != 12 {
		t.Fatalf("committed: %v, %v", ids, err)
	}
	if err := rs.Delete(ctx, kindPrepared, 12); err != nil {
		t.Fatal(err)
	}
	if ids, _ := rs.List(ctx, kindPrepared); len(ids) != 0 {
		t.Fatalf("prepared after delete: %v", ids)
	}
}
