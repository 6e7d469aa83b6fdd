package control

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/clink-wasm/clink-wasm/internal/s3test"
)

func openTest(t *testing.T, st ObjectStore) *Control {
	t.Helper()
	c, err := Open(context.Background(), st)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func fileStore(t *testing.T) *FileStore {
	t.Helper()
	st, err := OpenFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestFileStoreConditionalPut(t *testing.T) {
	testConditionalPut(t, fileStore(t))
}

func testConditionalPut(t *testing.T, st ObjectStore) {
	ctx := context.Background()
	name := fmt.Sprintf("t/obj-%s", strings.ReplaceAll(t.Name(), "/", "-"))
	if _, _, err := st.Get(ctx, name); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing object: %v", err)
	}
	g1, err := st.Put(ctx, name, []byte("one"), "")
	if err != nil {
		t.Fatal(err)
	}
	// Create-only fails once it exists.
	if _, err := st.Put(ctx, name, []byte("other"), ""); !errors.Is(err, ErrConflict) {
		t.Fatalf("second create: %v", err)
	}
	g2, err := st.Put(ctx, name, []byte("two"), g1)
	if err != nil || g2 == g1 {
		t.Fatalf("replace: %v (gen %q)", err, g2)
	}
	// A stale generation loses.
	if _, err := st.Put(ctx, name, []byte("stale"), g1); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale replace: %v", err)
	}
	b, g, err := st.Get(ctx, name)
	if err != nil || string(b) != "two" || g != g2 {
		t.Fatalf("get: %q %q %v", b, g, err)
	}
	if err := st.Delete(ctx, name); err != nil {
		t.Fatal(err)
	}
	if err := st.Delete(ctx, name); err != nil {
		t.Fatalf("deleting twice: %v", err)
	}
	for _, bad := range []string{"", "/abs", "../up", "a/../b", "a//b", ".hidden", "a\\b"} {
		if _, err := st.Put(ctx, bad, []byte("x"), ""); err == nil {
			t.Errorf("name %q accepted", bad)
		}
	}
}

func TestTransactionsSurviveRestart(t *testing.T) {
	ctx := context.Background()
	st := fileStore(t)
	c := openTest(t, st)
	err := c.Update(ctx, func(cat *Catalog) error {
		cat.Tenants["a"] = &Tenant{Name: "a", Quotas: DefaultQuotas()}
		cat.Pipelines["p"] = &Pipeline{ID: "p", Tenant: "a"}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetCheckpoint(ctx, "p", CheckpointPointer{ID: 5, URL: "file:///s"}); err != nil {
		t.Fatal(err)
	}
	// An older pointer never replaces a newer one.
	if err := c.SetCheckpoint(ctx, "p", CheckpointPointer{ID: 4, URL: "file:///s"}); err != nil {
		t.Fatal(err)
	}
	// A failing transaction writes nothing.
	boom := errors.New("boom")
	if err := c.Update(ctx, func(cat *Catalog) error { delete(cat.Tenants, "a"); return boom }); !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if _, ok := c.Snapshot().Tenants["a"]; !ok {
		t.Fatal("an aborted transaction changed the snapshot")
	}
	c2 := openTest(t, st)
	cat := c2.Snapshot()
	if cat.Tenants["a"] == nil || cat.Pipelines["p"].Checkpoint == nil || cat.Pipelines["p"].Checkpoint.ID != 5 {
		t.Fatalf("after restart: %+v", cat)
	}
	if err := c2.SetCheckpoint(ctx, "nope", CheckpointPointer{ID: 1}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("checkpoint of a missing pipeline: %v", err)
	}
}

// TestTwoWritersLoseNothing runs two Controls (two server processes) on one store: every
// increment of both lands, because the loser of each conditional write re-reads and re-applies.
func TestTwoWritersLoseNothing(t *testing.T) {
	testTwoWriters(t, fileStore(t))
}

func testTwoWriters(t *testing.T, st ObjectStore) {
	ctx := context.Background()
	a, b := openTest(t, st), openTest(t, st)
	const n = 20
	var wg sync.WaitGroup
	for i, c := range []*Control{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range n {
				err := c.Update(ctx, func(cat *Catalog) error {
					cat.Tenants[fmt.Sprintf("w%d-%d", i, j)] = &Tenant{Name: "x"}
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	c := openTest(t, st)
	if got := len(c.Snapshot().Tenants); got != 2*n {
		t.Fatalf("%d records, want %d", got, 2*n)
	}
}

func TestCorruptCatalogIsAnError(t *testing.T) {
	st := fileStore(t)
	if _, err := st.Put(context.Background(), CatalogObject, []byte("{not json"), ""); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(context.Background(), st); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("corrupt catalog: %v", err)
	}
}

func TestQuotas(t *testing.T) {
	if err := DefaultQuotas().Validate(""); err != nil {
		t.Fatal(err)
	}
	max := 3
	hosts := []string{"geo.internal", "*.svc.local", "api.example:8443"}
	q := QuotaPatch{MaxPipelines: &max, AllowedLookupHosts: &hosts}.Apply(DefaultQuotas())
	if q.MaxPipelines != 3 || q.MaxSubtasks != DefaultQuotas().MaxSubtasks {
		t.Fatalf("%+v", q)
	}
	for host, want := range map[string]bool{
		"geo.internal": true, "geo.internal:80": true, "GEO.internal": true, "a.svc.local": true, "b.a.svc.local": true,
		"svc.local": false, "api.example:8443": true, "api.example:443": false, "api.example": false, "evil.internal": false,
		"geo.internal.evil": false, "xgeo.internal": false,
	} {
		if got := q.HostAllowed(host); got != want {
			t.Errorf("HostAllowed(%q) = %v", host, got)
		}
	}
	var fe *FieldError
	bad := q
	bad.GuestMemoryBytes = 10
	if err := bad.Validate("quotas."); !errors.As(err, &fe) || fe.Field != "quotas.guest_memory_bytes" {
		t.Fatalf("%v", err)
	}
}

// s3Store opens the loopback S3 test server's bucket (scripts/with-s3.sh), or skips; under
// CI=true it fails instead, so CI cannot skip the S3 tests silently.
func s3Store(t *testing.T) ObjectStore {
	ep, bucket, ok := s3test.Endpoint(t)
	if !ok {
		t.Skip(s3test.Missing)
	}
	prefix := fmt.Sprintf("control-test/%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), os.Getpid())
	st, err := OpenStore(context.Background(), "s3://"+bucket+"/"+prefix, S3Options{Endpoint: ep, PathStyle: true})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestS3ConditionalPut(t *testing.T) { testConditionalPut(t, s3Store(t)) }
func TestS3TwoWriters(t *testing.T)     { testTwoWriters(t, s3Store(t)) }

func TestRefreshSeesAnotherWriter(t *testing.T) {
	ctx := context.Background()
	st := fileStore(t)
	a, b := openTest(t, st), openTest(t, st)
	if err := a.Update(ctx, func(cat *Catalog) error { cat.Tenants["x"] = &Tenant{Name: "x", TokenHash: "h"}; return nil }); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.Snapshot().Tenants["x"]; ok {
		t.Fatal("b saw the change before refreshing")
	}
	before := b.Snapshot()
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if tn, ok := b.Snapshot().TenantByTokenHash("h"); !ok || tn.Name != "x" {
		t.Fatal("b does not see a's tenant after refreshing")
	}
	// An unchanged catalog is not re-published.
	snap := b.Snapshot()
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if b.Snapshot() != snap || snap == before {
		t.Fatal("refresh of an unchanged catalog re-published it")
	}
}

func testUsage(t *testing.T, st ObjectStore) {
	ctx := context.Background()
	us, ok := st.(UsageStore)
	if !ok {
		t.Fatalf("%T is not a UsageStore", st)
	}
	pre, err := TenantStatePrefix("acme")
	if err != nil {
		t.Fatal(err)
	}
	if n, objs, err := us.Usage(ctx, pre); err != nil || n != 0 || objs != 0 {
		t.Fatalf("empty: %d bytes %d objects %v", n, objs, err)
	}
	for name, size := range map[string]int{"state/acme/pl-1/a": 100, "state/acme/pl-2/b/c": 250, "state/acmex/pl-3/d": 1000, "catalog-x": 7} {
		if _, err := st.Put(ctx, name, make([]byte, size), ""); err != nil {
			t.Fatal(err)
		}
	}
	if n, objs, err := us.Usage(ctx, pre); err != nil || n != 350 || objs != 2 {
		t.Fatalf("acme: %d bytes %d objects %v, want 350 in 2 (another tenant's prefix is not counted)", n, objs, err)
	}
	if _, _, err := us.Usage(ctx, "../"); err == nil {
		t.Fatal("a prefix stepping out of the root was accepted")
	}
	if _, err := TenantStatePrefix("../x"); err == nil {
		t.Fatal("a bad tenant name was accepted")
	}
}

func TestFileUsage(t *testing.T) { testUsage(t, fileStore(t)) }
func TestS3Usage(t *testing.T)   { testUsage(t, s3Store(t)) }
