package abi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/tetratelabs/wazero/api"
)

// Host-driven state migration (docs/abi.md, "clink_migrate"): two optional exports.
const (
	// ExportMigrate converts one stored value of an older state version; the host calls it
	// for every value of a restored checkpoint of another state_version.
	ExportMigrate = "clink_migrate"
	// ExportStateVersions declares state_version and migrates_from for toolchains whose
	// manifest cannot carry them (an SDK package that adds migration without changing the
	// core package's manifest builder).
	ExportStateVersions = "clink_state_versions"
)

// HasMigrate reports whether the module exports clink_migrate: a restore into it from another
// state version is then migrated by the host, eagerly, through the module.
func (m *Module) HasMigrate() bool {
	_, ok := m.compiled.ExportedFunctions()[ExportMigrate]
	return ok
}

// ErrMigrateDelete is returned by Migrate when the guest drops the entry (it returned -1).
var ErrMigrateDelete = errors.New("the module's clink_migrate dropped the entry")

// Migrate runs clink_migrate on one stored entry of state (an index into the manifest's
// states) written at state version from: the host writes key, entry and value to the input
// buffer and the guest returns packed (ptr, len) of the new value, or -1 to drop the entry
// (ErrMigrateDelete). The returned value aliases guest memory and is valid until the next call
// on the instance. The call has no key context: every import but log, watermark and
// processing_time returns NOT_ALLOWED.
func (in *Instance) Migrate(state uint32, from int, key, entry, value []byte) ([]byte, error) {
	fn := in.mod.ExportedFunction(ExportMigrate)
	if fn == nil {
		return nil, errors.New("module does not export clink_migrate")
	}
	if in.broken {
		return nil, errors.New("instance is broken")
	}
	n := len(key) + len(entry) + len(value)
	if err := in.ensureInput(n); err != nil {
		return nil, err
	}
	in.mem.Write(in.inPtr, key)
	in.mem.Write(in.inPtr+uint32(len(key)), entry)
	in.mem.Write(in.inPtr+uint32(len(key)+len(entry)), value)
	in.begin(callMigrate)
	stack := in.stack
	if len(stack) < 5 {
		stack = make([]uint64, 5)
		in.stack = stack
	}
	stack[0], stack[1], stack[2], stack[3], stack[4] = uint64(state), uint64(uint32(from)), uint64(len(key)), uint64(len(entry)), uint64(len(value))
	err := fn.CallWithStack(in.ctx, stack)
	ret := stack[0]
	in.leaveShare()
	in.kind = callNone
	in.hasPending = false
	in.stdout.flush()
	in.stderr.flush()
	if err != nil {
		in.broken = true
		return nil, in.fault(callMigrate, err)
	}
	if int64(ret) == -1 {
		return nil, ErrMigrateDelete
	}
	ptr, sz := uint32(ret>>32), uint32(ret)
	if int(sz) > in.limits.MaxStateValue {
		return nil, &Fault{Operator: in.m.Manifest.Name, Export: ExportMigrate, Kind: FaultTrap,
			Err: fmt.Errorf("clink_migrate returned a value of %d bytes, over the state value limit (%d)", sz, in.limits.MaxStateValue)}
	}
	v, ok := in.view(ptr, sz)
	if !ok {
		in.broken = true
		return nil, &Fault{Operator: in.m.Manifest.Name, Export: ExportMigrate, Kind: FaultTrap, Err: errors.New("clink_migrate returned a (ptr, len) outside memory")}
	}
	return v, nil
}

// readStateVersions applies clink_state_versions, when the module exports it, to the manifest
// just read: its JSON object {"state_version": N, "migrates_from": [...]} sets those fields,
// which the manifest must then leave unset.
func (m *Module) readStateVersions(ctx context.Context, rep *Report) {
	fn, ok := m.compiled.ExportedFunctions()[ExportStateVersions]
	if !ok || rep.Manifest == nil || len(rep.Problems) > 0 {
		return
	}
	if !sameTypes(fn.ParamTypes(), nil) || !sameTypes(fn.ResultTypes(), []api.ValueType{i64}) {
		return // checkExports reported the signature
	}
	if rep.Manifest.StateVersion != 0 || len(rep.Manifest.MigratesFrom) > 0 {
		rep.problem("the module exports %s and its manifest sets state_version or migrates_from: declare them in one place", ExportStateVersions)
		return
	}
	in, err := m.instantiate(ctx, discardHandler{})
	if err != nil {
		rep.problem("reading %s: %v", ExportStateVersions, err)
		return
	}
	defer in.discard(ctx)
	in.begin(callManifest)
	err = in.mod.ExportedFunction(ExportStateVersions).CallWithStack(in.ctx, in.stack)
	ret := in.stack[0]
	in.leaveShare()
	in.kind = callNone
	if err != nil {
		in.broken = true
		rep.problem("reading %s: %v", ExportStateVersions, in.fault(callManifest, err))
		return
	}
	b, ok := in.view(uint32(ret>>32), uint32(ret))
	if !ok {
		rep.problem("%s returned a (ptr, len) outside memory", ExportStateVersions)
		return
	}
	var v struct {
		StateVersion *int  `json:"state_version"`
		MigratesFrom []int `json:"migrates_from"`
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&v); err != nil || d.More() || v.StateVersion == nil {
		rep.problem(`%s must return one JSON object {"state_version": N, "migrates_from": [...]}: %q`, ExportStateVersions, truncate(b, 200))
		return
	}
	man := *rep.Manifest
	man.StateVersion, man.MigratesFrom = *v.StateVersion, v.MigratesFrom
	if err := man.Validate(); err != nil {
		rep.problem("%s: %v", ExportStateVersions, err)
		return
	}
	rep.Manifest = &man
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}
