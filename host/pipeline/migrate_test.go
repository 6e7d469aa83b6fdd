package pipeline

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestHostMigration: a checkpoint of host/abi's migv1 (state version 1: an 8-byte count)
// restored into migv2 (version 2: a 16-byte tagged count, which fails a record on any other
// form) is migrated by the host through migv2's clink_migrate before the first record: every
// key continues its count, the key the migration drops starts over, and a key the restored run
// never reads is migrated too, so the checkpoint after it holds version 2 only and the next
// restore migrates nothing. A clink_migrate that traps fails the restore naming the operator,
// the state and the key, without restarting and without touching the checkpoint.
func TestHostMigration(t *testing.T) {
	testHostMigration(t, abiFixture(t, "migv2"))
}

// TestHostMigrationSDKs is TestHostMigration with version 2 written with the Go and the
// AssemblyScript SDKs (guest-sdk/testdata/migrate: packages clink/migrate and
// assembly/migrate, which declare the version through clink_state_versions).
func TestHostMigrationSDKs(t *testing.T) {
	for _, lang := range []string{"go", "as"} {
		t.Run(lang, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("..", "..", "guest-sdk", "testdata", "migrate", "migrate-"+lang+".wasm"))
			if err != nil {
				t.Fatal(err)
			}
			testHostMigration(t, b)
		})
	}
}

func testHostMigration(t *testing.T, v2 []byte) {
	v1 := abiFixture(t, "migv1")
	pool := newMemPool(t)
	run := func(mod []byte, batch string, keys ...string) ([]string, *Summary, error) {
		var in strings.Builder
		for _, k := range keys {
			fmt.Fprintf(&in, "{\"u\":%q}\n", k)
		}
		out, sum, err := runOpts(t, Options{Module: mod, KeyField: "u", StateURL: pool, Restore: RestoreLatestIfAny, InputName: batch, MaxInFlight: 8}, in.String())
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		if out == "" {
			lines = nil
		}
		return lines, sum, err
	}
	var keys []string
	want := map[string]int{}
	for i := range 700 {
		k := fmt.Sprintf("k%d", i%60)
		keys = append(keys, k)
		want[k]++
	}
	keys = append(keys, "drop", "drop", "idle", "idle", "idle")
	want["drop"], want["idle"] = 2, 3
	if out, _, err := run(v1, "b1", keys...); err != nil || len(out) != len(keys) {
		t.Fatalf("v1: %v, %d lines", err, len(out))
	}
	// Version 2: each of k0..k59 once more, "drop" (dropped by the migration), a new key.
	var next []string
	for i := range 60 {
		next = append(next, fmt.Sprintf("k%d", i))
	}
	next = append(next, "drop", "fresh")
	out, sum, err := run(v2, "b2", next...)
	if err != nil {
		t.Fatalf("v2: %v", err)
	}
	r := sum.Restored
	if r == nil || !r.Migrated || r.Migration == nil || r.Migration.Migrated != 61 || r.Migration.Deleted != 1 ||
		!strings.Contains(r.String(), "state version 1 migrated to 2 through the module's clink_migrate (61 values rewritten, 1 dropped)") {
		t.Fatalf("restore info: %+v %v", r, r)
	}
	var wantOut []string
	for _, k := range next {
		n := want[k] + 1
		if k == "drop" {
			n = 1
		}
		wantOut = append(wantOut, fmt.Sprintf(`{"count":%d,"v":2}`, n))
	}
	slices.Sort(out)
	slices.Sort(wantOut)
	if !slices.Equal(out, wantOut) {
		t.Fatalf("v2 output\n%q\nwant\n%q", out, wantOut)
	}
	// The checkpoint is version 2 and holds "idle" migrated although b2 never read it.
	out, sum, err = run(v2, "b3", "idle", "k0")
	if err != nil || sum.Restored == nil || sum.Restored.Migrated || sum.Restored.Migration != nil {
		t.Fatalf("v2 again: %v %+v", err, sum.Restored)
	}
	if slices.Sort(out); !slices.Equal(out, []string{fmt.Sprintf(`{"count":%d,"v":2}`, want["k0"]+2), `{"count":4,"v":2}`}) {
		t.Fatalf("v2 again: %q", out)
	}

	// A trapping migration fails the restore, names what failed, and leaves the checkpoint
	// as it was: version 1 restores it still.
	pool = newMemPool(t)
	if _, _, err := run(v1, "p1", "a", "poison", "b"); err != nil {
		t.Fatal(err)
	}
	out, _, err = run(v2, "p2", "a")
	var me *MigrationError
	if !errors.Is(err, ErrMigration) || !errors.As(err, &me) || me.Operator != "migcount" || me.State != "count" || string(me.Key) != "poison" || len(out) != 0 {
		t.Fatalf("trapping migration: %v, output %q", err, out)
	}
	for _, s := range []string{`operator "migcount"`, `state "count" from version 1 to 2 failed at key "poison"`, "cannot migrate poison", "fix the module's clink_migrate"} {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("trapping migration: %q lacks %q", err, s)
		}
	}
	if out, _, err := run(v1, "p3", "poison"); err != nil || !slices.Equal(out, []string{`{"count":2}`}) {
		t.Fatalf("v1 after the failed migration: %v %q", err, out)
	}
}

// TestHostMigrationSpills: a migration of more state than the hot tier holds stays within the
// tier's budget by spilling, and every key is migrated: 20k keys (about 2.5 MB hot) through a
// 256 KiB hot tier, then one record of each of 200 keys spread over the key space reads its
// migrated count back.
func TestHostMigrationSpills(t *testing.T) {
	v1, v2 := abiFixture(t, "migv1"), abiFixture(t, "migv2")
	pool := "file://" + t.TempDir() + "?fsync=false"
	const n = 20000
	var in strings.Builder
	for i := range n {
		fmt.Fprintf(&in, "{\"u\":\"key-%d\"}\n", i)
	}
	opts := Options{Module: v1, KeyField: "u", StateURL: pool, Restore: RestoreLatestIfAny, InputName: "a", HotBytes: 256 << 10}
	if _, _, err := runOpts(t, opts, in.String()); err != nil {
		t.Fatal(err)
	}
	in.Reset()
	var want []string
	for i := 0; i < n; i += n / 200 {
		fmt.Fprintf(&in, "{\"u\":\"key-%d\"}\n", i)
		want = append(want, `{"count":2,"v":2}`)
	}
	opts.Module, opts.InputName = v2, "b"
	out, sum, err := runOpts(t, opts, in.String())
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Split(strings.TrimSuffix(out, "\n"), "\n"); !slices.Equal(got, want) {
		t.Fatalf("output %q", got)
	}
	if m := sum.Restored.Migration; m == nil || m.Migrated != n {
		t.Fatalf("migration %+v", m)
	}
	if sum.State == nil || sum.State.Spills == 0 || sum.State.HotLimit != 256<<10 {
		t.Fatalf("the migration did not spill under the budget: %+v", sum.State)
	}
}
