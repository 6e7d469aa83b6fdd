package state

import (
	"context"
	"fmt"
	"math"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/clink-wasm/clink-wasm/host/state/internal/format"
)

// RestoreLatest as OperatorOptions.RestoreFrom restores the newest complete checkpoint: the
// newest one whose manifests cover every key group of the operator. A coordinator that knows
// which checkpoint it completed should pass that id instead.
const RestoreLatest = math.MaxUint64

// Store is the process-wide state service: it owns the durable pool (selected by URL), the
// global hot-tier budget shared fairly by all operators and tenants, the remote IO limits, and
// the metrics. It hands out one Backend per operator subtask with Operator.
type Store struct {
	cfg    config
	os     objectStore // metered
	remote *remoteMetrics
	budget *budget
	ioSem  chan struct{} // bounds concurrent remote requests
	done   chan struct{}
	wg     sync.WaitGroup

	mu struct {
		sync.Mutex
		backends map[*Tiered]struct{}
		closed   bool
		retired  backendCounters // counters of closed backends, so totals stay monotonic
	}
}

// Open opens the durable pool named by rawURL and returns a Store over it:
//
//	mem://[name]                         in-process (tests); a named pool outlives the Store
//	file:///abs/path[?opt=v...]          one file per object, fsync'd (the embedded default)
//	s3://bucket[/prefix][?opt=v...]      S3 or an S3-compatible server, via aws-sdk-go-v2
//
// Options are documented on the With* functions and in docs/state-format.md; an Option given
// here overrides the same URL query option.
func Open(ctx context.Context, rawURL string, opts ...Option) (*Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("state: bad pool URL %q: %w", rawURL, err)
	}
	cfg := defaultConfig()
	if err := cfg.applyQuery(u.Query()); err != nil {
		return nil, err
	}
	for _, o := range opts {
		o.apply(&cfg)
	}
	cfg.poolDefaults(u.Scheme)
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	pool, err := openPool(ctx, u, &cfg)
	if err != nil {
		return nil, err
	}
	s := &Store{
		cfg:    cfg,
		remote: &remoteMetrics{},
		budget: newBudget(cfg.hotBytes),
		ioSem:  make(chan struct{}, cfg.ioConcurrency),
		done:   make(chan struct{}),
	}
	s.os = metered{st: pool, m: s.remote}
	s.mu.backends = map[*Tiered]struct{}{}
	s.wg.Add(1)
	go s.rebalanceLoop()
	return s, nil
}

// SetHotBytes changes the global hot-tier budget while the store runs (a live quota change;
// 0 = unbounded, negative is ignored). The backends' limits are re-shared at once; a runner
// holding more than its new limit evicts clean entries down to it on its next write, and dirty
// ones once the next checkpoint or spill has made them durable.
func (s *Store) SetHotBytes(n int64) {
	if n < 0 {
		return
	}
	s.budget.mu.Lock()
	s.budget.total = n
	s.budget.mu.Unlock()
	s.budget.rebalance()
}

// HotBytes returns the global hot-tier budget in force (0 = unbounded).
func (s *Store) HotBytes() int64 {
	s.budget.mu.Lock()
	defer s.budget.mu.Unlock()
	return s.budget.total
}

func (s *Store) rebalanceLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.rebalanceInterval)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
			s.budget.rebalance()
		}
	}
}

// OperatorOptions names one operator subtask's state.
type OperatorOptions struct {
	// Name is the operator's stable identity (its uid): state written under one name is
	// restored under the same name. Required.
	Name string
	// Tenant scopes the operator's objects and its share of the hot budget. Optional.
	Tenant string
	// NumKeyGroups is the operator's fixed number of key groups (default: the Store's, 128).
	NumKeyGroups int
	// KeyGroups is the range this subtask owns (default: all). See KeyGroupRangeFor.
	KeyGroups KeyGroupRange
	// RestoreFrom is the checkpoint to restore: 0 starts empty, RestoreLatest takes the newest
	// complete one. Restore is lazy: only manifests are read before Operator returns.
	RestoreFrom uint64
	// HotBytes, when > 0, gives this subtask a fixed hot budget instead of a fair share.
	HotBytes int64
}

// operatorRoot is the object-name prefix of an operator.
func operatorRoot(tenant, name string) string {
	if tenant != "" {
		return "tenants/" + url.PathEscape(tenant) + "/operators/" + url.PathEscape(name) + "/"
	}
	return "operators/" + url.PathEscape(name) + "/"
}

// Operator returns the Backend of one operator subtask, restoring it if asked. The caller must
// Close it. Two live backends must not own overlapping key groups of the same operator: the
// newer one fences the older (its next checkpoint fails with ErrFenced).
func (s *Store) Operator(ctx context.Context, o OperatorOptions) (*Tiered, error) {
	if o.Name == "" {
		return nil, fmt.Errorf("state: operator name required")
	}
	if o.NumKeyGroups == 0 {
		o.NumKeyGroups = s.cfg.numKeyGroups
	}
	if o.NumKeyGroups < 1 || o.NumKeyGroups > MaxKeyGroups {
		return nil, fmt.Errorf("state: key groups must be in [1, %d]", MaxKeyGroups)
	}
	if o.KeyGroups == (KeyGroupRange{}) {
		o.KeyGroups = KeyGroupRange{Lo: 0, Hi: o.NumKeyGroups}
	}
	if o.KeyGroups.Lo < 0 || o.KeyGroups.Hi > o.NumKeyGroups || o.KeyGroups.Empty() {
		return nil, fmt.Errorf("state: bad key-group range %v of %d", o.KeyGroups, o.NumKeyGroups)
	}
	s.mu.Lock()
	closed := s.mu.closed
	s.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	b, err := newTiered(ctx, s, o)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		b.Close()
		return nil, ErrClosed
	}
	s.mu.backends[b] = struct{}{}
	s.mu.Unlock()
	s.budget.join(b.member)
	return b, nil
}

func (s *Store) forget(b *Tiered) {
	s.budget.leave(b.member)
	s.mu.Lock()
	if _, ok := s.mu.backends[b]; ok {
		delete(s.mu.backends, b)
		s.mu.retired.add(&b.cnt, false)
	}
	s.mu.Unlock()
}

// Checkpoints lists the complete checkpoints of an operator, newest first, and the savepoints
// among them.
func (s *Store) Checkpoints(ctx context.Context, tenant, operator string, numKeyGroups int) (complete []uint64, savepoints []uint64, err error) {
	if numKeyGroups == 0 {
		numKeyGroups = s.cfg.numKeyGroups
	}
	root := operatorRoot(tenant, operator)
	objs, err := s.os.list(ctx, root+"manifests/")
	if err != nil {
		return nil, nil, err
	}
	names := make([]string, len(objs))
	for i, o := range objs {
		names[i] = strings.TrimPrefix(o.name, root)
	}
	complete = format.CompleteCheckpoints(names, numKeyGroups)
	sp, err := s.os.list(ctx, root+"savepoints/")
	if err != nil {
		return nil, nil, err
	}
	for _, o := range sp {
		var c uint64
		if _, err := fmt.Sscanf(strings.TrimPrefix(o.name, root+"savepoints/"), "%d", &c); err == nil {
			savepoints = append(savepoints, c)
		}
	}
	sort.Slice(savepoints, func(i, j int) bool { return savepoints[i] > savepoints[j] })
	return complete, savepoints, nil
}

// Close closes every backend still open and the pool. Pending persists fail with ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return nil
	}
	s.mu.closed = true
	bs := make([]*Tiered, 0, len(s.mu.backends))
	for b := range s.mu.backends {
		bs = append(bs, b)
	}
	s.mu.Unlock()
	for _, b := range bs {
		b.Close()
	}
	close(s.done)
	s.wg.Wait()
	return s.os.close()
}

// acquire takes a remote-IO slot.
func (s *Store) acquire(ctx context.Context) error {
	select {
	case s.ioSem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Store) release() { <-s.ioSem }
