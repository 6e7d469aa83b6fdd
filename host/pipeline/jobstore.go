package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// CheckpointRecord is the job-level checkpoint: the one object whose commit makes checkpoint n
// of a job exist. It names everything a restore needs (docs/DESIGN.md, "Pipelines and
// checkpoints").
type CheckpointRecord struct {
	Format    string    `json:"format"` // RecordFormat
	Job       string    `json:"job"`
	Tenant    string    `json:"tenant,omitempty"`
	ID        uint64    `json:"id"`
	Attempt   uint64    `json:"attempt"`
	Savepoint bool      `json:"savepoint,omitempty"`
	Final     bool      `json:"final,omitempty"` // taken at the end of a bounded job
	Created   time.Time `json:"created"`
	KeyGroups int       `json:"key_groups"`
	// SpecSHA256 is the hash of the spec the checkpoint was taken under (informational).
	SpecSHA256 string `json:"spec_sha256,omitempty"`

	Sources   map[string]*SourceCheckpoint   `json:"sources"`
	Operators map[string]*OperatorCheckpoint `json:"operators"`
	Sinks     map[string]*SinkCheckpoint     `json:"sinks"`
}

// RecordFormat identifies the checkpoint record's format.
const RecordFormat = "clink-job-checkpoint/1"

// SourceCheckpoint is a source's positions.
type SourceCheckpoint struct {
	Parallelism int     `json:"parallelism"`
	Splits      []Split `json:"splits"`
}

// OperatorCheckpoint names an operator's state checkpoint.
type OperatorCheckpoint struct {
	ModuleSHA256 string   `json:"module_sha256"`
	Module       string   `json:"module_name"`
	States       []string `json:"states"`
	Parallelism  int      `json:"parallelism"`
	// StateName is the operator's uid in the state pool; StateCheckpoint the checkpoint of it
	// (one manifest per key-group range, listed in KeyGroupRanges).
	StateName       string   `json:"state_name"`
	StateCheckpoint uint64   `json:"state_checkpoint"`
	KeyGroupRanges  [][2]int `json:"key_group_ranges"`
	Bytes           int64    `json:"bytes"`
}

// SinkCheckpoint is a sink's pre-committed output.
type SinkCheckpoint struct {
	Parallelism int    `json:"parallelism"`
	Prepared    []byte `json:"prepared,omitempty"`
}

// recordStore keeps a job's checkpoint records and attempt claims. Commit is create-once: the
// record's existence is the commit point. The file store writes a temporary file, fsyncs it
// and links it into place (link fails if the name exists), then fsyncs the directory; an S3
// store uses a conditional PUT (If-None-Match: *): see poolRecords.
type recordStore interface {
	// ClaimAttempt creates the next attempt number (create-once), fencing older attempts'
	// checkpoint ids.
	ClaimAttempt(ctx context.Context) (uint64, error)
	// Put writes a record under kind (committed or prepared), create-once.
	Put(ctx context.Context, kind string, rec *CheckpointRecord) error
	Get(ctx context.Context, kind string, id uint64) (*CheckpointRecord, error)
	List(ctx context.Context, kind string) ([]uint64, error) // ascending
	Delete(ctx context.Context, kind string, id uint64) error
}

const (
	kindCommitted = "checkpoints"
	kindPrepared  = "prepared"
)

// ErrRecordExists is a create-once write of a name that exists.
var ErrRecordExists = errors.New("checkpoint record already exists")

func recordName(id uint64) string { return fmt.Sprintf("%020d.json", id) }

// openRecordStore returns the record store of a job in the pool named by stateURL.
func openRecordStore(stateURL, tenant, job string) (recordStore, error) {
	u, err := url.Parse(stateURL)
	if err != nil {
		return nil, fmt.Errorf("state URL: %w", err)
	}
	t := tenant
	if t == "" {
		t = "_"
	}
	rel := filepath.Join("jobs", url.PathEscape(t), url.PathEscape(job))
	switch u.Scheme {
	case "file":
		return &fileRecords{dir: filepath.Join(u.Path, rel)}, nil
	case "mem":
		memRecordsMu.Lock()
		defer memRecordsMu.Unlock()
		key := u.Host + u.Path + "/" + rel
		m := memRecords[key]
		if m == nil {
			m = &memRecordStore{objs: map[string][]byte{}}
			if u.Host+u.Path != "" { // a named pool outlives its users, like state's mem://name
				memRecords[key] = m
			}
		}
		return m, nil
	}
	return nil, fmt.Errorf("checkpoint records on %s:// pools are not supported (use file://, s3:// or mem://)", u.Scheme)
}

// --- file:// ---

type fileRecords struct{ dir string }

func (f *fileRecords) kindDir(kind string) string { return filepath.Join(f.dir, kind) }

func (f *fileRecords) createOnce(dir, name string, data []byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Link(tmp.Name(), filepath.Join(dir, name)); err != nil {
		if errors.Is(err, os.ErrExist) || errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("%s: %w", name, ErrRecordExists)
		}
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func (f *fileRecords) ClaimAttempt(ctx context.Context) (uint64, error) {
	dir := f.kindDir("attempts")
	for range 100 {
		ids, err := listNumbered(dir, "")
		if err != nil {
			return 0, err
		}
		next := uint64(1)
		if len(ids) > 0 {
			next = ids[len(ids)-1] + 1
		}
		err = f.createOnce(dir, strconv.FormatUint(next, 10), []byte(time.Now().UTC().Format(time.RFC3339Nano)))
		if errors.Is(err, ErrRecordExists) {
			continue // another attempt claimed it first
		}
		if err != nil {
			return 0, fmt.Errorf("claiming an attempt: %w", err)
		}
		return next, nil
	}
	return 0, errors.New("claiming an attempt: too much contention")
}

func (f *fileRecords) Put(ctx context.Context, kind string, rec *CheckpointRecord) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return f.createOnce(f.kindDir(kind), recordName(rec.ID), append(b, '\n'))
}

func (f *fileRecords) Get(ctx context.Context, kind string, id uint64) (*CheckpointRecord, error) {
	b, err := os.ReadFile(filepath.Join(f.kindDir(kind), recordName(id)))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("checkpoint %d: %w", id, ErrNoCheckpoint)
		}
		return nil, err
	}
	return decodeRecord(b, id)
}

func (f *fileRecords) List(ctx context.Context, kind string) ([]uint64, error) {
	return listNumbered(f.kindDir(kind), ".json")
}

func (f *fileRecords) Delete(ctx context.Context, kind string, id uint64) error {
	err := os.Remove(filepath.Join(f.kindDir(kind), recordName(id)))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

func listNumbered(dir, suffix string) ([]uint64, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ids []uint64
	for _, e := range ents {
		n, ok := strings.CutSuffix(e.Name(), suffix)
		if !ok || strings.HasPrefix(n, ".") {
			continue
		}
		if id, err := strconv.ParseUint(n, 10, 64); err == nil {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids, nil
}

func decodeRecord(b []byte, id uint64) (*CheckpointRecord, error) {
	var r CheckpointRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("checkpoint record %d is corrupt: %w", id, err)
	}
	if r.Format != RecordFormat {
		return nil, fmt.Errorf("checkpoint record %d has format %q; this host reads %q", id, r.Format, RecordFormat)
	}
	if r.ID != id {
		return nil, fmt.Errorf("checkpoint record %d names checkpoint %d", id, r.ID)
	}
	return &r, nil
}

// --- mem:// ---

var (
	memRecordsMu sync.Mutex
	memRecords   = map[string]*memRecordStore{}
)

type memRecordStore struct {
	mu   sync.Mutex
	objs map[string][]byte
	att  uint64
}

func (m *memRecordStore) ClaimAttempt(ctx context.Context) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.att++
	return m.att, nil
}

func (m *memRecordStore) Put(ctx context.Context, kind string, rec *CheckpointRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	k := kind + "/" + recordName(rec.ID)
	if _, ok := m.objs[k]; ok {
		return fmt.Errorf("%s: %w", k, ErrRecordExists)
	}
	m.objs[k] = b
	return nil
}

func (m *memRecordStore) Get(ctx context.Context, kind string, id uint64) (*CheckpointRecord, error) {
	m.mu.Lock()
	b, ok := m.objs[kind+"/"+recordName(id)]
	m.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("checkpoint %d: %w", id, ErrNoCheckpoint)
	}
	return decodeRecord(b, id)
}

func (m *memRecordStore) List(ctx context.Context, kind string) ([]uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ids []uint64
	for k := range m.objs {
		if n, ok := strings.CutPrefix(k, kind+"/"); ok {
			if id, err := strconv.ParseUint(strings.TrimSuffix(n, ".json"), 10, 64); err == nil {
				ids = append(ids, id)
			}
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids, nil
}

func (m *memRecordStore) Delete(ctx context.Context, kind string, id uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.objs, kind+"/"+recordName(id))
	return nil
}
