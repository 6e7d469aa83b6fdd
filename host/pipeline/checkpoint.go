package pipeline

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/clink-wasm/clink-wasm/host/scheduler"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// DefaultStateDir is where `clink-wasm run` keeps durable state when no state URL is given:
// a file:// pool under the working directory.
const DefaultStateDir = ".clink/state"

// StateURLForDir returns the file:// URL of a state directory.
func StateURLForDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	return (&url.URL{Scheme: "file", Path: abs}).String(), nil
}

// RestoreLatestIfAny as Options.Restore restores the newest complete checkpoint when there is
// one and starts empty when there is none: for scripts that run the same command every time.
// (Options.Restore = state.RestoreLatest fails when there is none.)
const RestoreLatestIfAny uint64 = state.RestoreLatest - 1

// ParseRestore reads a --restore value: "" or "none" starts empty, "latest" takes the newest
// complete checkpoint (and fails if there is none), "latest-if-any" takes it if there is one,
// a number names one.
func ParseRestore(s string) (uint64, error) {
	switch strings.ToLower(s) {
	case "", "none":
		return 0, nil
	case "latest":
		return state.RestoreLatest, nil
	case "latest-if-any", "if-any":
		return RestoreLatestIfAny, nil
	}
	id, err := strconv.ParseUint(s, 10, 64)
	if err != nil || id == 0 || id >= RestoreLatestIfAny {
		return 0, fmt.Errorf("restore: want none, latest, latest-if-any or a checkpoint id, not %q", s)
	}
	return id, nil
}

// ErrNoCheckpoint reports a restore that found no checkpoint to restore. The run does not start:
// starting from empty state would look like a successful resume.
var ErrNoCheckpoint = errors.New("no checkpoint to restore")

// ErrModuleMismatch reports a checkpoint written by a module that shares no state with the one
// being restored into.
var ErrModuleMismatch = errors.New("checkpoint belongs to another module")

// NoCheckpointError says which checkpoint was looked for, of which job, and where.
type NoCheckpointError struct {
	Job      string
	Pool     string   // the pool URL, credentials redacted
	Want     uint64   // the checkpoint asked for; state.RestoreLatest for the newest
	Existing []uint64 // the job's complete checkpoints, newest first
}

func (e *NoCheckpointError) Error() string {
	var b strings.Builder
	if e.Want == state.RestoreLatest {
		fmt.Fprintf(&b, "no checkpoint of job %q in %s to restore", e.Job, e.Pool)
	} else {
		fmt.Fprintf(&b, "checkpoint %d of job %q is not in %s", e.Want, e.Job, e.Pool)
	}
	if len(e.Existing) > 0 {
		fmt.Fprintf(&b, " (it has checkpoint%s %s)", pluralSuffix(len(e.Existing)), joinIDs(e.Existing, 5))
	}
	switch {
	case len(e.Existing) > 0:
	case strings.HasPrefix(e.Pool, "mem:"):
		b.WriteString("; mem:// state lives in process memory only, so a new run has no checkpoint")
	default:
		b.WriteString("; check --state and --job (the job defaults to the operator's name), or use --restore latest-if-any to start empty when there is none")
	}
	return b.String()
}

func (e *NoCheckpointError) Is(target error) bool { return target == ErrNoCheckpoint }

func pluralSuffix(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func joinIDs(ids []uint64, most int) string {
	parts := make([]string, 0, min(len(ids), most)+1)
	for i, id := range ids {
		if i == most {
			parts = append(parts, "...")
			break
		}
		parts = append(parts, strconv.FormatUint(id, 10))
	}
	return strings.Join(parts, ", ")
}

// ModuleStateName is the operator-state blob in which every checkpoint records the identity of
// the module that wrote it (a JSON ModuleIdentity).
const ModuleStateName = "clink.module"

// ModuleIdentity identifies the module that wrote a checkpoint: its bytes' sha256 (hex), its
// operator name and its declared state names.
type ModuleIdentity struct {
	SHA256 string   `json:"sha256"`
	Name   string   `json:"name"`
	States []string `json:"states"`
}

// IdentifyModule returns the identity of a module's bytes with its manifest's name and states.
func IdentifyModule(bin []byte, name string, states []string) ModuleIdentity {
	sum := sha256.Sum256(bin)
	return ModuleIdentity{SHA256: hex.EncodeToString(sum[:]), Name: name, States: append([]string{}, states...)}
}

func (m ModuleIdentity) String() string {
	return fmt.Sprintf("%s (sha256 %.12s)", m.Name, m.SHA256)
}

// RestoreInfo reports what a run restored.
type RestoreInfo struct {
	Checkpoint uint64 // the checkpoint restored; 0 when latest-if-any found none
	// From is the module that wrote it; nil when the checkpoint records none (written before
	// checkpoints recorded it).
	From *ModuleIdentity
	// Upgrade is set when From is another module that shares state names with this one: the
	// states in Kept are restored, those in Dropped are not read, those in Added start empty.
	Upgrade              bool
	Kept, Dropped, Added []string
	// Into is the module restored into.
	Into ModuleIdentity
	// Migrated is set when the checkpoint's state version (FromVersion) is not the module's
	// (ToVersion), which migrates it (its manifest's migrates_from).
	Migrated               bool
	FromVersion, ToVersion int
	// Migration is set when the host migrated the state through the module's clink_migrate
	// (docs/abi.md) before the first record, and says what it did.
	Migration *MigrationStats
}

// String describes the restore in one line.
func (r *RestoreInfo) String() string {
	s := r.describe()
	switch {
	case r.Migrated && r.Migration != nil:
		s += fmt.Sprintf("; state version %d migrated to %d through the module's clink_migrate (%d values rewritten, %d dropped)",
			r.FromVersion, r.ToVersion, r.Migration.Migrated, r.Migration.Deleted)
	case r.Migrated:
		s += fmt.Sprintf("; state version %d migrated to %d by the module", r.FromVersion, r.ToVersion)
	}
	return s
}

func (r *RestoreInfo) describe() string {
	switch {
	case r.Checkpoint == 0:
		return "no checkpoint to restore (--restore latest-if-any): started from empty state"
	case r.From == nil:
		return fmt.Sprintf("restored checkpoint %d (it does not record which module wrote it)", r.Checkpoint)
	case r.Upgrade:
		s := fmt.Sprintf("restored checkpoint %d of module %s into module %s, an upgrade: state kept: %s",
			r.Checkpoint, r.From, r.Into, namesOrNone(r.Kept))
		if len(r.Dropped) > 0 {
			s += "; not restored (no longer declared): " + strings.Join(r.Dropped, ", ")
		}
		if len(r.Added) > 0 {
			s += "; new, starting empty: " + strings.Join(r.Added, ", ")
		}
		return s
	}
	return fmt.Sprintf("restored checkpoint %d", r.Checkpoint)
}

// checkModule compares the module a checkpoint records with the one restoring it. The same
// module, or one that shares at least one state name (an upgrade), may restore; a module that
// shares none may not, unless neither declares any state.
func checkModule(info *RestoreInfo, recorded []byte, cur ModuleIdentity, job, pool string) error {
	if len(recorded) == 0 {
		return nil
	}
	var prev ModuleIdentity
	if err := json.Unmarshal(recorded, &prev); err != nil {
		return fmt.Errorf("checkpoint %d of job %q in %s: unreadable module record: %w", info.Checkpoint, job, pool, err)
	}
	info.From, info.Into = &prev, cur
	if prev.SHA256 == cur.SHA256 {
		return nil
	}
	for _, s := range prev.States {
		if slices.Contains(cur.States, s) {
			info.Kept = append(info.Kept, s)
		} else {
			info.Dropped = append(info.Dropped, s)
		}
	}
	for _, s := range cur.States {
		if !slices.Contains(prev.States, s) {
			info.Added = append(info.Added, s)
		}
	}
	if len(info.Kept) == 0 && (len(prev.States) > 0 || len(cur.States) > 0) {
		return fmt.Errorf("%w: checkpoint %d of job %q in %s was written by module %s with state %s; module %s declares %s: no state in common, so nothing could be restored (name the job that belongs to this module with --job, or start empty without --restore)",
			ErrModuleMismatch, info.Checkpoint, job, pool, prev, namesOrNone(prev.States), cur, namesOrNone(cur.States))
	}
	info.Upgrade = true
	return nil
}

func namesOrNone(s []string) string {
	if len(s) == 0 {
		return "(none)"
	}
	return strings.Join(s, ", ")
}

// ParseByteSize reads a size as the state pool's hot_bytes does: a number of bytes with an
// optional binary suffix k, m or g (also written KiB, MiB, GiB): "1048576", "64k", "8m", "2GiB".
func ParseByteSize(s string) (int64, error) {
	num, mult := strings.TrimSpace(s), int64(1)
	lower := strings.ToLower(num)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}} {
		if strings.HasSuffix(lower, u.suffix) {
			num, mult = num[:len(num)-len(u.suffix)], u.mult
			break
		}
	}
	v, err := strconv.ParseInt(num, 10, 64)
	if err != nil || v < 0 || v > math.MaxInt64/mult {
		return 0, fmt.Errorf("bad size %q: want a number of bytes with an optional k, m or g suffix (binary: 8m is 8 MiB)", s)
	}
	return v * mult, nil
}

// remapCapturedInput merges, after a restore at another parallelism, the captured input of the
// old subtasks whose key groups overlap b's (host/scheduler/capture.go: the records a barrier
// captured instead of draining them), keeping the records whose key falls in b's key groups,
// and stores the result where the scheduler reads it. A key belongs to one old subtask, so
// each key's records keep their order; records of different keys need none. The watermark is
// the lowest of the old subtasks': no replayed record sees a watermark its own subtask had
// not reached.
func remapCapturedInput(b *state.Tiered) error {
	blobs := b.RestoredOperatorState(scheduler.InputStateName)
	if len(blobs) == 0 || (len(blobs) == 1 && blobs[0].Range == b.KeyGroups()) {
		return nil // a restore at the same parallelism: the scheduler reads its own blob
	}
	own, numKG := b.KeyGroups(), b.NumKeyGroups()
	merged := scheduler.CapturedInput{Watermark: math.MaxInt64}
	for _, rb := range blobs {
		in, err := scheduler.DecodeCapturedInput(rb.Data)
		if err != nil {
			return fmt.Errorf("key groups %v: %w", rb.Range, err)
		}
		merged.Watermark = min(merged.Watermark, in.Watermark)
		for _, r := range in.Records {
			if own.Contains(state.KeyGroupOf(r.Key, numKG)) {
				merged.Records = append(merged.Records, r)
			}
		}
	}
	b.SetOperatorState(scheduler.InputStateName, scheduler.EncodeCapturedInput(merged))
	return nil
}
