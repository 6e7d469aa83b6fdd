// Package control keeps the hosted platform's durable records, its control plane: tenants and
// their quotas, the module registry, pipeline records and their checkpoint pointers.
//
// Everything but module bytes lives in one catalog object (catalog.json) in an object store
// (file:// by default, s3:// in production). A change is a transaction: the catalog is copied,
// changed, and written back with a conditional write on the generation it was read at, so a
// change is committed whole or not at all, and two writers (two server processes on one store,
// by mistake or during a hand-over) cannot lose each other's changes: the loser re-reads and
// re-applies its change, or fails with its reason. Module bytes are content-addressed blobs
// (modules/sha256/<hex>.wasm) written before the catalog that names them, so a committed
// catalog never names a missing blob.
//
// # Notes
//
//   - The catalog is small (records, not data), so one object is cheap to rewrite and gives
//     cross-record invariants for free: a module cannot be deleted while a pipeline that uses
//     it is being created, because both are one conditional write on the same object.
//   - Readers get an immutable snapshot (Snapshot); INVARIANT: a published *Catalog is never
//     mutated, transactions work on a deep copy.
//   - The package knows nothing of HTTP: host/server maps its errors to responses.
package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
)

// CatalogObject is the name of the catalog in the store.
const CatalogObject = "catalog.json"

// catalogVersion is the format of catalog.json this code writes and reads.
const catalogVersion = 1

// Catalog is every control-plane record. Maps are keyed as documented on each field.
type Catalog struct {
	Version        int                  `json:"version"`
	AdminTokenHash string               `json:"admin_token_hash,omitempty"`
	Tenants        map[string]*Tenant   `json:"tenants"`   // by name
	Modules        map[string]*Module   `json:"modules"`   // by ModuleKey(tenant, id)
	Pipelines      map[string]*Pipeline `json:"pipelines"` // by id

	byToken map[string]*Tenant // token hash → tenant; set on publish (the catalog is immutable then)
}

// Tenant is one tenant: its quotas and the hash of its API token.
type Tenant struct {
	Name      string    `json:"name"`
	Quotas    Quotas    `json:"quotas"`
	TokenHash string    `json:"token_hash"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Module is a registered module: its bytes are the blob BlobName(ID).
type Module struct {
	ID        string       `json:"id"` // sha256 of the bytes, hex
	Tenant    string       `json:"tenant"`
	Name      string       `json:"name"`
	Version   string       `json:"version"`
	Size      int64        `json:"size"`
	Manifest  abi.Manifest `json:"manifest"`
	Memory    string       `json:"memory,omitempty"` // as abi.Report.Memory
	CreatedAt time.Time    `json:"created_at"`
}

// Pipeline is a stored pipeline record: its spec and what the control plane knows of it.
type Pipeline struct {
	ID       string          `json:"id"`
	Tenant   string          `json:"tenant"`
	Name     string          `json:"name"`
	Spec     json.RawMessage `json:"spec"`
	Modules  []string        `json:"modules"`  // module ids the spec uses, resolved at write
	Subtasks int             `json:"subtasks"` // total parallelism the spec asks for
	State    string          `json:"state"`    // "created" until a runtime runs it; see the Pipeline* states
	// Running says the pipeline should run: set by start, cleared by stop and by a failure. A
	// restarted server resumes every pipeline with Running set, from its last checkpoint.
	Running bool `json:"running,omitempty"`
	// Error is why the pipeline last failed (cleared by a start).
	Error     string    `json:"error,omitempty"`
	Revision  int       `json:"revision"` // incremented by every spec change
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// Checkpoint is the last completed checkpoint or savepoint, the restore point.
	Checkpoint *CheckpointPointer `json:"checkpoint,omitempty"`
}

// CheckpointPointer names a completed checkpoint of a pipeline's state.
type CheckpointPointer struct {
	ID        uint64    `json:"id"`
	URL       string    `json:"url"` // the state pool the checkpoint lives in
	Savepoint bool      `json:"savepoint,omitempty"`
	At        time.Time `json:"at"`
}

// ModuleKey is the catalog key of tenant's module id.
func ModuleKey(tenant, id string) string { return tenant + "/" + id }

// BlobName is the object that holds the bytes of the module with id.
func BlobName(id string) string { return "modules/sha256/" + id + ".wasm" }

// PipelineState values.
const (
	PipelineCreated  = "created"
	PipelineRunning  = "running"
	PipelineStopped  = "stopped"
	PipelineFailed   = "failed"
	PipelineFinished = "finished"
)

func emptyCatalog() *Catalog {
	return &Catalog{Version: catalogVersion, Tenants: map[string]*Tenant{}, Modules: map[string]*Module{}, Pipelines: map[string]*Pipeline{}}
}

func (c *Catalog) clone() (*Catalog, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	return decodeCatalog(b)
}

func decodeCatalog(b []byte) (*Catalog, error) {
	c := emptyCatalog()
	if err := json.Unmarshal(b, c); err != nil {
		return nil, fmt.Errorf("control: %s is corrupt: %w", CatalogObject, err)
	}
	if c.Version != catalogVersion {
		return nil, fmt.Errorf("control: %s has format version %d; this build reads %d", CatalogObject, c.Version, catalogVersion)
	}
	if c.Tenants == nil {
		c.Tenants = map[string]*Tenant{}
	}
	if c.Modules == nil {
		c.Modules = map[string]*Module{}
	}
	if c.Pipelines == nil {
		c.Pipelines = map[string]*Pipeline{}
	}
	return c, nil
}

// Control is the control plane over one object store. It is safe for concurrent use.
type Control struct {
	store ObjectStore
	now   func() time.Time

	mu struct {
		sync.Mutex // serialises transactions in this process
		cat        *Catalog
		gen        string
	}
	snap sync.Mutex // guards reading mu.cat without waiting on a transaction's store write
	cur  *Catalog
}

// Option configures Open.
type Option func(*Control)

// WithClock sets the clock that stamps records (tests).
func WithClock(now func() time.Time) Option { return func(c *Control) { c.now = now } }

// Open reads the catalog from store, or starts an empty one.
func Open(ctx context.Context, store ObjectStore, opts ...Option) (*Control, error) {
	c := &Control{store: store, now: time.Now}
	for _, o := range opts {
		o(c)
	}
	if err := c.reload(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// reload reads the committed catalog. Called with mu held (or before c is shared).
func (c *Control) reload(ctx context.Context) error {
	b, gen, err := c.store.Get(ctx, CatalogObject)
	var cat *Catalog
	switch {
	case errors.Is(err, ErrNotFound):
		cat, gen = emptyCatalog(), ""
	case err != nil:
		return fmt.Errorf("control: reading the catalog: %w", err)
	case gen == c.mu.gen && c.mu.cat != nil:
		return nil // unchanged since it was last read
	default:
		if cat, err = decodeCatalog(b); err != nil {
			return err
		}
	}
	c.mu.cat, c.mu.gen = cat, gen
	c.publish(cat)
	return nil
}

func (c *Control) publish(cat *Catalog) {
	idx := make(map[string]*Tenant, len(cat.Tenants))
	for _, t := range cat.Tenants {
		if t.TokenHash != "" {
			idx[t.TokenHash] = t
		}
	}
	cat.byToken = idx
	c.snap.Lock()
	c.cur = cat
	c.snap.Unlock()
}

// Snapshot returns the committed catalog. The caller must not modify it.
func (c *Control) Snapshot() *Catalog {
	c.snap.Lock()
	defer c.snap.Unlock()
	return c.cur
}

// Now is the control plane's clock.
func (c *Control) Now() time.Time { return c.now().UTC() }

// Store is the object store the control plane writes to.
func (c *Control) Store() ObjectStore { return c.store }

// maxTxAttempts bounds how often a transaction is re-applied after losing to another writer.
const maxTxAttempts = 32

// Update runs fn on a copy of the catalog and commits the result atomically. If fn returns an
// error nothing is written and Update returns it. If another writer committed first, the
// catalog is re-read and fn runs again on the new one (so fn must decide only from the catalog
// it is given).
func (c *Control) Update(ctx context.Context, fn func(*Catalog) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for attempt := 0; ; attempt++ {
		next, err := c.mu.cat.clone()
		if err != nil {
			return err
		}
		if err := fn(next); err != nil {
			return err
		}
		b, err := json.MarshalIndent(next, "", "  ")
		if err != nil {
			return err
		}
		gen, err := c.store.Put(ctx, CatalogObject, b, c.mu.gen)
		if err == nil {
			c.mu.cat, c.mu.gen = next, gen
			c.publish(next)
			return nil
		}
		if !errors.Is(err, ErrConflict) || attempt+1 >= maxTxAttempts {
			return fmt.Errorf("control: committing the catalog: %w", err)
		}
		// Another writer won. A jittered pause keeps two writers from losing to each other
		// in lockstep.
		t := time.NewTimer(time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 7))))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		if err := c.reload(ctx); err != nil {
			return err
		}
	}
}

// Refresh re-reads the committed catalog, to see changes another process committed (a second
// server on the same store). It costs one read of the catalog object.
func (c *Control) Refresh(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reload(ctx)
}

// PutBlob stores module bytes under their content address before a catalog names them.
func (c *Control) PutBlob(ctx context.Context, id string, data []byte) error {
	return c.store.PutImmutable(ctx, BlobName(id), data)
}

// Blob reads a module's bytes.
func (c *Control) Blob(ctx context.Context, id string) ([]byte, error) {
	b, _, err := c.store.Get(ctx, BlobName(id))
	return b, err
}

// DeleteBlobIfUnused removes a module blob that no module record names any more.
func (c *Control) DeleteBlobIfUnused(ctx context.Context, id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.mu.cat.Modules {
		if m.ID == id {
			return nil
		}
	}
	return c.store.Delete(ctx, BlobName(id))
}

// SetCheckpoint records pipeline id's latest completed checkpoint (the runtime calls this once
// the checkpoint is durable). A pointer older than the recorded one is ignored.
func (c *Control) SetCheckpoint(ctx context.Context, id string, p CheckpointPointer) error {
	return c.Update(ctx, func(cat *Catalog) error {
		pl, ok := cat.Pipelines[id]
		if !ok {
			return fmt.Errorf("pipeline %q: %w", id, ErrNotFound)
		}
		if pl.Checkpoint != nil && pl.Checkpoint.ID >= p.ID {
			return nil
		}
		if p.At.IsZero() {
			p.At = c.Now()
		}
		pl.Checkpoint = &p
		return nil
	})
}

// SetPipelineState records what the runtime says of pipeline id: its state, the error it
// failed with ("" for none) and, when running is not nil, whether it should run.
func (c *Control) SetPipelineState(ctx context.Context, id, state, errMsg string, running *bool) error {
	return c.Update(ctx, func(cat *Catalog) error {
		pl, ok := cat.Pipelines[id]
		if !ok {
			return fmt.Errorf("pipeline %q: %w", id, ErrNotFound)
		}
		pl.State, pl.Error = state, errMsg
		if running != nil {
			pl.Running = *running
		}
		pl.UpdatedAt = c.Now()
		return nil
	})
}

// TenantByTokenHash finds the tenant whose token hashes to h. On a published catalog it is a
// map lookup (the index is built once per commit); on a catalog being changed, a scan.
func (cat *Catalog) TenantByTokenHash(h string) (*Tenant, bool) {
	if cat.byToken != nil {
		t, ok := cat.byToken[h]
		return t, ok
	}
	for _, t := range cat.Tenants {
		if t.TokenHash == h {
			return t, true
		}
	}
	return nil, false
}

// TenantModules returns tenant's modules.
func (cat *Catalog) TenantModules(tenant string) []*Module {
	var out []*Module
	for _, m := range cat.Modules {
		if m.Tenant == tenant {
			out = append(out, m)
		}
	}
	return out
}

// TenantPipelines returns tenant's pipelines.
func (cat *Catalog) TenantPipelines(tenant string) []*Pipeline {
	var out []*Pipeline
	for _, p := range cat.Pipelines {
		if p.Tenant == tenant {
			out = append(out, p)
		}
	}
	return out
}
