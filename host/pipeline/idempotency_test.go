package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/lookup"
	"github.com/clink-wasm/clink-wasm/host/scheduler"
)

// TestLookupIdempotencyKeys: every POST a record makes carries an Idempotency-Key derived from
// the record and the call, so the records replayed after a restore present the keys they
// presented before the crash: a deduplicating upstream sees exactly one effect per record.
func TestLookupIdempotencyKeys(t *testing.T) {
	var mu sync.Mutex
	keysOf := map[string]map[string]bool{} // request body -> keys seen
	effects := map[string]bool{}           // keys seen: the upstream's deduplicated effects
	var requests atomic.Int64
	ctx, crash := context.WithCancel(context.Background())
	defer crash()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		k := r.Header.Get("Idempotency-Key")
		if requests.Add(1) == 2000 {
			// The first run stops here: this record has not completed, so no committed
			// checkpoint covers it, and the restored run sends it again.
			crash()
		}
		mu.Lock()
		if keysOf[string(body)] == nil {
			keysOf[string(body)] = map[string]bool{}
		}
		keysOf[string(body)][k] = true
		effects[k] = true
		mu.Unlock()
		fmt.Fprintf(w, `{"got":%s}`, body)
	}))
	defer srv.Close()
	ep, err := ParseEndpointFlag("svc=" + srv.URL + "/api")
	if err != nil {
		t.Fatal(err)
	}
	ep.Methods = []string{"POST"}

	const n = 3000
	var in strings.Builder
	for i := range n {
		fmt.Fprintf(&in, "{\"u\":\"k%d\",\"i\":%d}\n", i%50, i)
	}
	pool := newMemPool(t)
	opts := Options{Module: abiFixture(t, "enrich"), KeyField: "u", Endpoints: []lookup.EndpointConfig{ep},
		StateURL: pool, CheckpointEvery: time.Millisecond, InputName: "in", MaxInFlight: 8}
	var out bytes.Buffer
	opts.Input, opts.Output = strings.NewReader(in.String()), &out
	if _, err := Run(ctx, opts); !errors.Is(err, context.Canceled) {
		t.Fatalf("first run: %v", err)
	}
	first := requests.Load()
	opts.Restore = RestoreLatestIfAny // the first checkpoint's, or a fresh start: a replay either way
	out2, sum, err := runOpts(t, opts, in.String())
	if err != nil || sum.Restored == nil {
		t.Fatalf("restore: %v %+v", err, sum)
	}
	if strings.Count(out2, "\n") == 0 {
		t.Fatalf("the restored run sent nothing: %+v, restored %v, first %d, requests %d", sum, sum.Restored, first, requests.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(keysOf) != n {
		t.Fatalf("%d distinct records reached the upstream, want %d", len(keysOf), n)
	}
	for body, keys := range keysOf {
		if len(keys) != 1 || keys[""] {
			t.Fatalf("record %s was sent with keys %v, want one", body, keys)
		}
	}
	if len(effects) != n {
		t.Fatalf("%d effects after deduplication, want %d (one per record)", len(effects), n)
	}
	if total := requests.Load(); total <= int64(n) || first < 2000 {
		t.Fatalf("%d requests (%d before the crash): nothing was replayed, so the test proves nothing", total, first)
	}
}

// TestLookupIdempotencyKeyDerivation: the key depends on the job, the operator, the record
// (position, key, value) and the call's index, and on nothing else.
func TestLookupIdempotencyKeyDerivation(t *testing.T) {
	type call = struct {
		tenant, job, op string
		timer           bool
		pos, ts         int64
		key, value      string
		idx             int
	}
	base := call{"", "job", "op", false, 7, 100, "k", "v", 0}
	key := func(c call) string {
		return lookupIdempotencyKey(c.tenant, c.job, c.op, schedulerCall(c.timer, c.pos, c.ts, c.key, c.value, c.idx))
	}
	same := base
	same.ts = 999 // ingestion time differs on a replay: not part of a record's key
	if key(base) != key(same) || len(key(base)) != 32 {
		t.Fatalf("unstable key: %s %s", key(base), key(same))
	}
	for _, mod := range []func(*call){
		func(c *call) { c.tenant = "t" }, func(c *call) { c.job = "job2" }, func(c *call) { c.op = "op2" },
		func(c *call) { c.pos = 8 }, func(c *call) { c.key = "k2" }, func(c *call) { c.value = "v2" },
		func(c *call) { c.idx = 1 }, func(c *call) { c.timer = true },
		func(c *call) { c.key, c.value = "kv", "" }, // field boundaries are part of the hash
	} {
		c := base
		mod(&c)
		if key(c) == key(base) {
			t.Fatalf("%+v has the key of %+v", c, base)
		}
	}
}

func schedulerCall(timer bool, pos, ts int64, key, value string, idx int) scheduler.LookupCall {
	return scheduler.LookupCall{Timer: timer, Pos: pos, TS: ts, Key: []byte(key), Value: []byte(value), Index: idx}
}
