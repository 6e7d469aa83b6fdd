package state

import (
	"context"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// slowPuts delays every PUT by d on the bubble's clock, and logs the objects' kinds in the
// order their PUTs started.
type slowPuts struct {
	objectStore
	d       time.Duration
	mu      sync.Mutex
	started []string
}

func (p *slowPuts) put(ctx context.Context, name string, data []byte, c putCond) (string, error) {
	kind := "segment"
	switch {
	case strings.Contains(name, "manifests/"):
		kind = "manifest"
	case strings.Contains(name, "heads/"):
		kind = "head"
	}
	p.mu.Lock()
	p.started = append(p.started, kind)
	p.mu.Unlock()
	time.Sleep(p.d)
	return p.objectStore.put(ctx, name, data, c)
}

// TestFenceBesideSegmentPuts: a checkpoint's fence on the lineage head goes beside its segments'
// PUTs, then the manifest: two round trips, not three (issue 10: the final checkpoint of a short
// run was 60-90 ms, three PUT latencies one after the other). The checkpoint restores whole.
func TestFenceBesideSegmentPuts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const d = 10 * time.Millisecond
		s := openTest(t, "mem://fence")
		b := operator(t, s, OperatorOptions{})
		pool := &slowPuts{objectStore: s.os, d: d}
		s.os = pool
		for i := range 50 {
			b.Put(key(0, string(rune('a'+i%26))+strings.Repeat("x", i), ""), []byte{byte(i)})
		}
		start := time.Now()
		checkpoint(t, b, 1)
		if took := time.Since(start); took != 2*d {
			t.Errorf("checkpoint persisted in %v, want %v (segments beside the head, then the manifest); PUTs started: %v", took, 2*d, pool.started)
		}
		if n := len(pool.started); n < 3 || pool.started[n-1] != "manifest" {
			t.Errorf("PUTs started %v, want the manifest last", pool.started)
		}
		r := operator(t, s, OperatorOptions{Name: "op", RestoreFrom: RestoreLatest})
		for i := range 50 {
			k := key(0, string(rune('a'+i%26))+strings.Repeat("x", i), "")
			f, err := fetchSync(t, r, []Key{k})
			if err != nil || len(f) != 1 || !f[0].Found || len(f[0].Value) != 1 || f[0].Value[0] != byte(i) {
				t.Fatalf("restored %q: %+v, %v", k.Record, f, err)
			}
		}
	})
}
