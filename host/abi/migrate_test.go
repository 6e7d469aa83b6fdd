package abi

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMigrateExport: clink_migrate gets the state, the version, and the key, entry and value
// in the input buffer; -1 deletes; a trap is a fault with the guest's message; no import but
// log works inside it. migv2 keeps the count (8 bytes) and tags it with version 2.
func TestMigrateExport(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, Limits{})
	m := load(t, e, "migv2")
	if !m.HasMigrate() || load(t, e, "migv1").HasMigrate() {
		t.Fatal("HasMigrate")
	}
	h := newRec()
	in, err := m.Instantiate(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close(ctx)
	v, err := in.Migrate(0, 1, []byte("k"), nil, []byte{7, 0, 0, 0, 0, 0, 0, 0})
	if err != nil || len(v) != 16 || v[0] != 7 || v[8] != 2 {
		t.Fatalf("migrate: %v %v", v, err)
	}
	if _, err := in.Migrate(0, 1, []byte("drop"), nil, make([]byte, 8)); !errors.Is(err, ErrMigrateDelete) {
		t.Fatalf("drop: %v", err)
	}
	_, err = in.Migrate(0, 1, []byte("poison"), nil, make([]byte, 8))
	var f *Fault
	if !errors.As(err, &f) || f.Export != ExportMigrate || !strings.Contains(err.Error(), "cannot migrate poison") || !in.Broken() {
		t.Fatalf("trap: %v", err)
	}
	if _, err := load(t, e, "migv1").Instantiate(ctx, h); err != nil {
		t.Fatal(err)
	}
}

// TestStateVersionsExport: a module may declare state_version and migrates_from through
// clink_state_versions instead of its manifest (the SDKs' migrate packages do), but not in
// both places.
func TestStateVersionsExport(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, Limits{})
	bin, err := os.ReadFile(filepath.Join("..", "..", "guest-sdk", "testdata", "migrate", "migrate-as.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := e.Load(ctx, bin)
	if err != nil {
		t.Fatal(err)
	}
	if m.Manifest.StateVersion != 2 || len(m.Manifest.MigratesFrom) != 1 || m.Manifest.MigratesFrom[0] != 1 || !m.HasMigrate() {
		t.Fatalf("manifest %+v", m.Manifest)
	}
	both, err := EmbedManifest(bin, []byte(`{"abi":1,"name":"migcount","states":["count"],"state_version":2}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Load(ctx, both); err == nil || !strings.Contains(err.Error(), "declare them in one place") {
		t.Fatalf("both: %v", err)
	}
}
