package state

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/state/internal/format"
	"github.com/clink-wasm/clink-wasm/internal/s3test"
)

// s3URL returns an s3:// URL under a fresh prefix of the test server started by
// scripts/s3-up.sh. Without CLINK_TEST_S3_ENDPOINT the test is skipped, except under CI=true
// where it fails: CI must not skip the S3 tests silently.
func s3URL(t testing.TB, query string) string {
	t.Helper()
	ep, bucket, ok := s3test.Endpoint(t)
	if !ok {
		t.Skip(s3test.Missing)
	}
	prefix := fmt.Sprintf("t/%s-%s", strings.ReplaceAll(t.Name(), "/", "_"), randomHex(4))
	q := "endpoint=" + url.QueryEscape(ep) + "&path_style=true"
	if query != "" {
		q += "&" + query
	}
	return "s3://" + bucket + "/" + prefix + "?" + q
}

func TestS3RoundTrip(t *testing.T) {
	u := s3URL(t, "")
	s := openTest(t, u)
	b := operator(t, s, OperatorOptions{Name: "rt"})
	for i := range 2000 {
		b.Put(key(0, fmt.Sprint("k", i), ""), []byte(fmt.Sprint("v", i)))
	}
	b.SetOperatorState("timers", []byte("x"))
	checkpoint(t, b, 1)
	b.Delete(key(0, "k5", ""))
	checkpoint(t, b, 2)
	b.Close()
	r := operator(t, s, OperatorOptions{Name: "rt", RestoreFrom: RestoreLatest})
	var keys []Key
	for i := range 2000 {
		keys = append(keys, key(0, fmt.Sprint("k", i), ""))
	}
	f, err := fetchSync(t, r, keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, x := range f {
		if want := fmt.Sprint("v", i); x.Found != (i != 5) || x.Found && string(x.Value) != want {
			t.Fatalf("%d: %+v", i, x)
		}
	}
	m := s.Metrics()
	t.Logf("S3 round trip: %d GETs, %d PUTs, %.1f keys/block, get latency %v", m.RemoteGets, m.RemotePuts,
		float64(m.FetchKeys)/float64(m.FetchBlocks), m.RemoteGetLatency)
}

// TestS3ConditionalWrites checks the fencing that depends on the server evaluating
// If-None-Match and If-Match (internal/objstore's TestConditionalPuts checks the pool itself).
func TestS3ConditionalWrites(t *testing.T) {
	u := s3URL(t, "")
	s := openTest(t, u)
	ctx := context.Background()
	// The whole fencing path: a stale writer's checkpoint fails.
	old := operator(t, s, OperatorOptions{Name: "f"})
	old.Put(key(0, "a", ""), []byte("1"))
	checkpoint(t, old, 1)
	newer := operator(t, s, OperatorOptions{Name: "f", RestoreFrom: 1})
	old.Put(key(0, "a", ""), []byte("zombie"))
	snap, _ := old.Capture(2)
	if err := snap.Persist(ctx); !errors.Is(err, ErrFenced) {
		t.Fatalf("stale writer not fenced: %v", err)
	}
	newer.Put(key(0, "a", ""), []byte("2"))
	checkpoint(t, newer, 2)
	// And the same checkpoint id cannot be committed twice for a range.
	other := operator(t, s, OperatorOptions{Name: "f", RestoreFrom: 2})
	if err := other.createOnce(ctx, other.root+format.ManifestName(2, other.rng), []byte("x")); !errors.Is(err, ErrFenced) {
		t.Fatalf("manifest created twice: %v", err)
	}
}

type fault int

const (
	faultNone fault = iota
	fault500
	faultSlowDown
	faultTimeout
	faultSlowBody
	faultCutPut    // the connection drops while the PUT body is being sent
	faultLostReply // the request lands, the reply is lost
	numFaults
)

var faultNames = [...]string{"none", "500", "SlowDown", "timeout", "slow-body", "cut-put", "lost-reply"}

// faultyTransport injects faults in front of a real S3 server.
type faultyTransport struct {
	base http.RoundTripper
	rate float64
	mu   sync.Mutex
	rng  *rand.Rand
	hist [numFaults]int
}

func (f *faultyTransport) pick(req *http.Request) fault {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rng.Float64() >= f.rate {
		return faultNone
	}
	k := fault(1 + f.rng.IntN(int(numFaults)-1))
	switch {
	case (k == faultCutPut || k == faultLostReply) && req.Method != http.MethodPut:
		k = fault500
	case k == faultSlowBody && req.Method != http.MethodGet:
		k = faultSlowDown
	}
	f.hist[k]++
	return k
}

func errorReply(req *http.Request, status int, code string) *http.Response {
	body := fmt.Sprintf(`<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>injected</Message></Error>`, code)
	return &http.Response{
		StatusCode: status, Status: fmt.Sprintf("%d %s", status, http.StatusText(status)),
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Request: req,
		Header:        http.Header{"Content-Type": {"application/xml"}},
		Body:          io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body)),
	}
}

type slowBody struct {
	io.ReadCloser
	ctx context.Context
}

func (b slowBody) Read(p []byte) (int, error) {
	select {
	case <-time.After(2 * time.Second):
	case <-b.ctx.Done():
		return 0, b.ctx.Err()
	}
	return b.ReadCloser.Read(p)
}

func (f *faultyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	reset := &net.OpError{Op: "write", Net: "tcp", Err: syscall.ECONNRESET}
	switch f.pick(req) {
	case fault500:
		return errorReply(req, 500, "InternalError"), nil
	case faultSlowDown:
		return errorReply(req, 503, "SlowDown"), nil
	case faultTimeout:
		select {
		case <-req.Context().Done():
			return nil, req.Context().Err()
		case <-time.After(5 * time.Second):
			return nil, reset
		}
	case faultCutPut:
		if req.Body != nil {
			_, _ = io.CopyN(io.Discard, req.Body, req.ContentLength/2)
			req.Body.Close()
		}
		return nil, reset
	case faultLostReply:
		resp, err := f.base.RoundTrip(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	case faultSlowBody:
		resp, err := f.base.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		resp.Body = slowBody{ReadCloser: resp.Body, ctx: req.Context()}
		return resp, nil
	}
	return f.base.RoundTrip(req)
}

// TestS3FaultInjection runs checkpoints, restores and cold reads through a transport that
// injects every fault kind. Each failure must be retried or reported; a reported checkpoint
// failure loses nothing (its keys go into the next checkpoint), and every successful checkpoint
// restores exactly the model as of its capture.
func TestS3FaultInjection(t *testing.T) {
	u := s3URL(t, "timeout=150ms&max_attempts=4&max_backoff=20ms")
	ft := &faultyTransport{base: http.DefaultTransport.(*http.Transport).Clone(), rate: 0.25, rng: rand.New(rand.NewPCG(1, 2))}
	s := openTest(t, u, WithS3(S3Options{HTTPClient: &http.Client{Transport: ft}}), WithHotBytes(16<<10), WithMaxSegments(3))
	ctx := context.Background()
	b := operator(t, s, OperatorOptions{Name: "faulty"})
	model := map[string]string{}
	committed := map[uint64]map[string]string{}
	rng := rand.New(rand.NewPCG(3, 4))
	var ok, failed int
	for c := uint64(1); c <= 24; c++ {
		ft.mu.Lock()
		ft.rate = 0.2
		if c > 18 { // a bad patch: some requests exhaust their retries
			ft.rate = 0.6
		}
		ft.mu.Unlock()
		for range 100 {
			k := fmt.Sprint("k", rng.IntN(300))
			if rng.IntN(6) == 0 {
				b.Delete(key(0, k, ""))
				delete(model, k)
			} else {
				v := fmt.Sprint(c, "/", rng.Int())
				b.Put(key(0, k, ""), []byte(v))
				model[k] = v
			}
		}
		snap, err := b.Capture(c)
		if err != nil {
			t.Fatal(err)
		}
		at := map[string]string{}
		for k, v := range model {
			at[k] = v
		}
		if err := snap.Persist(ctx); err != nil {
			failed++
			t.Logf("checkpoint %d failed (reported): %v", c, err)
			if errors.Is(err, ErrFenced) || errors.Is(err, ErrCorrupt) {
				t.Fatalf("fault misreported as permanent: %v", err)
			}
			continue
		}
		ok++
		committed[c] = at
		// Cold reads through the faults: a failed fetch is reported, never wrong.
		var keys []Key
		for i := range 300 {
			k := key(0, fmt.Sprint("k", i), "")
			if _, _, hot := b.Get(k); !hot {
				keys = append(keys, k)
			}
		}
		if f, err := fetchSync(t, b, keys); err == nil {
			for _, x := range f {
				want, found := model[string(x.Key.Record)]
				if x.Found != found || x.Found && string(x.Value) != want {
					t.Fatalf("cold read %s: %q,%v want %q,%v", x.Key.Record, x.Value, x.Found, want, found)
				}
			}
			b.Fill(f)
		} else {
			t.Logf("fetch failed (reported): %v", err)
		}
	}
	ft.mu.Lock() // background work (compaction, GC) may still send requests through ft
	hist := ft.hist
	ft.mu.Unlock()
	t.Logf("checkpoints: %d ok, %d failed; faults injected: %v", ok, failed, histString(hist[:]))
	if ok == 0 {
		t.Fatal("no checkpoint succeeded")
	}
	ft.mu.Lock()
	ft.rate = 0
	ft.mu.Unlock()
	// Verify every committed checkpoint through a clean client.
	clean := openTest(t, u)
	for c, want := range committed {
		r := operator(t, clean, OperatorOptions{Name: "faulty", RestoreFrom: c})
		var keys []Key
		for i := range 300 {
			keys = append(keys, key(0, fmt.Sprint("k", i), ""))
		}
		f, err := fetchSync(t, r, keys)
		if err != nil {
			t.Fatalf("restore %d: %v", c, err)
		}
		for _, x := range f {
			w, found := want[string(x.Key.Record)]
			if x.Found != found || x.Found && string(x.Value) != w {
				t.Fatalf("checkpoint %d key %s: %q,%v want %q,%v", c, x.Key.Record, x.Value, x.Found, w, found)
			}
		}
		r.Close()
	}
}

func histString(h []int) string {
	var parts []string
	for i, n := range h {
		if i > 0 && n > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", faultNames[i], n))
		}
	}
	return strings.Join(parts, " ")
}
