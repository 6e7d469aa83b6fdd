package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// Host-driven state migration (docs/abi.md, "clink_migrate"; docs/DESIGN.md, "State
// migration"). A restore into a module whose state_version differs from the checkpoint's, and
// that exports clink_migrate, rewrites the restored state before the first record runs: each
// subtask streams the live entries of its key groups out of the checkpoint (Tiered.
// ScanRestored, a batch of blocks per segment at a time) through the module and puts the
// migrated values into its backend, whose hot tier spills under its budget as usual. The
// first checkpoint then holds only values of the new version, so a restore from it migrates
// nothing; a crash before it restores the old checkpoint again and migrates again.

// ErrMigration is wrapped by every failed host-driven migration (a *MigrationError): the
// restore cannot succeed by retrying, so the job fails instead of restarting.
var ErrMigration = errors.New("state migration failed")

// MigrationError reports the entry whose migration failed, with the module's fault.
type MigrationError struct {
	Operator   string
	Subtask    int
	Checkpoint uint64
	State      string
	Key, Entry []byte
	From, To   int
	Err        error
}

func (e *MigrationError) Error() string {
	entry := ""
	if len(e.Entry) > 0 {
		entry = fmt.Sprintf(", entry %q", e.Entry)
	}
	return fmt.Sprintf("operator %q: migrating checkpoint %d's state %q from version %d to %d failed at key %q%s: %v "+
		"(fix the module's clink_migrate, or restore into a module of state version %d)",
		e.Operator, e.Checkpoint, e.State, e.From, e.To, e.Key, entry, e.Err, e.From)
}

func (e *MigrationError) Unwrap() []error { return []error{ErrMigration, e.Err} }

// MigrationStats counts what a host-driven migration did, summed over an operator's subtasks.
type MigrationStats struct {
	Migrated, Deleted int64
	// Retired counts the entries of states the module no longer declares: left as they are.
	Retired int64
}

// migrateRestored runs the host-driven migration of every restored operator whose module
// exports clink_migrate and whose checkpoint holds another state version (migrate.go).
func (a *attempt) migrateRestored(ctx context.Context) error {
	if a.restored == nil {
		return nil
	}
	for _, op := range a.ops {
		oc := a.restored.Operators[op.spec.Name]
		if oc == nil || oc.StateVersion == op.mod.Manifest.StateVersion || !op.mod.HasMigrate() || a.env.Native[op.spec.Name] != nil {
			continue
		}
		var backends []*state.Tiered
		for _, t := range a.opTasks {
			if t.op == op {
				backends = append(backends, t.backend)
			}
		}
		// The flag form's spec names its one operator "operator"; its errors name the module.
		name := op.spec.Name
		if a.env.flag != nil {
			name = op.mod.Name()
		}
		start := time.Now()
		st, err := migrateOperator(ctx, op, name, backends, a.restored.ID, oc.StateVersion, a.log)
		if err != nil {
			return err
		}
		a.log.Info("migrated the restored state through the module's clink_migrate", "operator", name,
			"checkpoint", a.restored.ID, "from_version", oc.StateVersion, "to_version", op.mod.Manifest.StateVersion,
			"migrated", st.Migrated, "deleted", st.Deleted, "retired", st.Retired, "took", time.Since(start).Round(time.Millisecond))
		if f := a.env.flag; f != nil {
			f.migrated(st)
		}
	}
	return nil
}

// migrateOperator migrates the restored state of every subtask of op, in parallel, from
// state version from to the module's. It runs before the attempt's tasks start, so each
// backend is used by its migrating goroutine alone.
func migrateOperator(ctx context.Context, op *opNode, name string, backends []*state.Tiered, ckpt uint64, from int, log *slog.Logger) (MigrationStats, error) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total MigrationStats
		errs  = make([]error, len(backends))
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i, b := range backends {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := migrateSubtask(ctx, op, name, i, b, ckpt, from, log)
			if err != nil {
				errs[i] = err
				cancel() // the others stop at their next read
				return
			}
			mu.Lock()
			total.Migrated += st.Migrated
			total.Deleted += st.Deleted
			total.Retired += st.Retired
			mu.Unlock()
		}()
	}
	wg.Wait()
	// The first failure, not the cancellations it caused.
	for _, err := range errs {
		if errors.Is(err, ErrMigration) {
			return total, err
		}
	}
	return total, errors.Join(errs...)
}

func migrateSubtask(ctx context.Context, op *opNode, name string, subtask int, b *state.Tiered, ckpt uint64, from int, log *slog.Logger) (MigrationStats, error) {
	var st MigrationStats
	m := op.mod.Manifest
	ids := make(map[string]uint32, len(m.States))
	for i, n := range m.States {
		ids[n] = uint32(i)
	}
	h := &migrateHandler{log: log, operator: name}
	inst, err := op.mod.Instantiate(ctx, h)
	if err != nil {
		return st, fmt.Errorf("operator %s[%d]: an instance to migrate state with: %w", name, subtask, err)
	}
	defer inst.Close(ctx)
	err = b.ScanRestored(ctx, func(stateName string, record, entry, value []byte) error {
		id, ok := ids[stateName]
		if !ok {
			st.Retired++ // a state the module dropped: nothing reads it
			return nil
		}
		k := state.Key{State: state.StateID(id), Record: record, Entry: entry}
		nv, err := inst.Migrate(id, from, record, entry, value)
		switch {
		case errors.Is(err, abi.ErrMigrateDelete):
			b.Delete(k)
			st.Deleted++
			return nil
		case err != nil:
			return &MigrationError{Operator: name, Subtask: subtask, Checkpoint: ckpt, State: stateName,
				Key: append([]byte(nil), record...), Entry: append([]byte(nil), entry...), From: from, To: m.StateVersion, Err: err}
		}
		b.Put(k, nv) // Put copies
		st.Migrated++
		return nil
	})
	if err != nil {
		return st, err
	}
	return st, nil
}

// migrateHandler serves the migrating instance's imports: clink_migrate has no key context,
// so every import but log is refused (docs/abi.md), and clink_open runs with no lookups.
type migrateHandler struct {
	keyOnlyHandler
	log      *slog.Logger
	operator string
}

func (h *migrateHandler) Log(level abi.LogLevel, msg []byte) {
	if h.log != nil {
		h.log.Info("guest log while migrating state", "operator", h.operator, "level", int(level), "message", string(msg))
	}
}
