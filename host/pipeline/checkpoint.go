package pipeline

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

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

// ParseRestore reads a --restore value: "" or "none" starts empty, "latest" takes the newest
// complete checkpoint, a number names one.
func ParseRestore(s string) (uint64, error) {
	switch strings.ToLower(s) {
	case "", "none":
		return 0, nil
	case "latest":
		return state.RestoreLatest, nil
	}
	id, err := strconv.ParseUint(s, 10, 64)
	if err != nil || id == 0 {
		return 0, fmt.Errorf("restore: want none, latest or a checkpoint id, not %q", s)
	}
	return id, nil
}

// checkpointer captures state on the runner at each barrier and persists it on its own
// goroutine, acknowledging (counting) a checkpoint only once its commit is durable. Snapshots
// are persisted in capture order, as the state tier requires.
type checkpointer struct {
	b       state.Backend
	queue   chan checkpointJob
	done    chan struct{}
	timeout time.Duration

	mu        sync.Mutex
	err       error
	completed []uint64
	bytes     int64
	took      time.Duration
}

type checkpointJob struct {
	id   uint64
	snap state.Snapshot
	at   time.Time
}

func newCheckpointer(b state.Backend) *checkpointer {
	c := &checkpointer{b: b, queue: make(chan checkpointJob, 4), done: make(chan struct{}), timeout: 5 * time.Minute}
	go c.loop()
	return c
}

func (c *checkpointer) loop() {
	defer close(c.done)
	for j := range c.queue {
		ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
		err := j.snap.Persist(ctx)
		cancel()
		c.mu.Lock()
		if err != nil {
			if c.err == nil {
				c.err = fmt.Errorf("checkpoint %d: %w", j.id, err)
			}
		} else {
			c.completed = append(c.completed, j.id)
			c.bytes += j.snap.Bytes()
			c.took += time.Since(j.at)
		}
		c.mu.Unlock()
	}
}

func (c *checkpointer) failure() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// capture runs on the runner at a drained barrier. A persist failure of an earlier checkpoint
// surfaces here, failing the pipeline at its next barrier.
func (c *checkpointer) capture(id uint64) error {
	if err := c.failure(); err != nil {
		return err
	}
	start := time.Now()
	snap, err := c.b.Capture(id)
	if err != nil {
		return err
	}
	c.queue <- checkpointJob{id: id, snap: snap, at: start}
	return nil
}

// finish waits for every queued checkpoint to be durable.
func (c *checkpointer) finish() error {
	close(c.queue)
	<-c.done
	return c.failure()
}

// nextCheckpointID returns the first id after every checkpoint the store already has for the
// operator, so a new run never collides with an old one.
func nextCheckpointID(ctx context.Context, st *state.Store, tenant, op string) (uint64, error) {
	done, saves, err := st.Checkpoints(ctx, tenant, op, 0)
	if err != nil && !errors.Is(err, state.ErrNotFound) {
		return 0, err
	}
	next := uint64(1)
	for _, id := range slices.Concat(done, saves) {
		next = max(next, id+1)
	}
	return next, nil
}
