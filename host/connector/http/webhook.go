// Package http has the HTTP connectors of pipelines. The webhook sink POSTs each record to a
// URL with an idempotency key, retrying transient failures.
//
// Delivery is at least once, deduplicated: a record's Idempotency-Key is derived from the job,
// the sink, the record's source position, timestamp and value (and its ordinal among identical
// ones), so a record replayed after a restore presents the same key and a deduplicating
// receiver sees one effect. Every request in flight is finished before a checkpoint's barrier
// passes the sink, so a committed checkpoint never depends on an undelivered record.
package http

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// Register adds the webhook sink ("webhook") to c.
func Register(c *pipeline.Connectors) { c.RegisterSink("webhook", NewWebhook) }

// Webhook is a configured webhook sink.
type Webhook struct {
	url         string
	method      string
	maxAttempts int
	backoff     time.Duration
	maxBackoff  time.Duration
	inFlight    int
	client      *http.Client
	name        string
}

// NewWebhook builds a webhook sink: url (required, http or https), method (POST), timeout
// (per attempt, 10s), max_attempts (5), backoff (100ms, doubled per attempt up to
// max_backoff, 5s), max_in_flight (1: records are delivered in order; more trades order for
// throughput).
func NewWebhook(spec *pipeline.SinkSpec, o *pipeline.ConnectorOptions, env *pipeline.Env) (pipeline.Sink, error) {
	w := &Webhook{
		url:         o.String("url", ""),
		method:      o.String("method", http.MethodPost),
		maxAttempts: int(o.Int("max_attempts", 5)),
		inFlight:    int(o.Int("max_in_flight", 1)),
		name:        spec.Name,
	}
	dur := func(k string, def time.Duration) time.Duration {
		s := o.String(k, def.String())
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			o.Fail(k, "want a positive duration like \"100ms\", not %q", s)
			return def
		}
		return d
	}
	timeout := dur("timeout", 10*time.Second)
	w.backoff, w.maxBackoff = dur("backoff", 100*time.Millisecond), dur("max_backoff", 5*time.Second)
	u, err := url.Parse(w.url)
	switch {
	case w.url == "":
		o.Fail("url", "required")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		o.Fail("url", "want an http:// or https:// URL, not %q", w.url)
	}
	if w.method != http.MethodPost && w.method != http.MethodPut {
		o.Fail("method", "want POST or PUT")
	}
	if w.maxAttempts < 1 || w.maxAttempts > 100 {
		o.Fail("max_attempts", "must be in [1, 100]")
	}
	if w.inFlight < 1 || w.inFlight > 1024 {
		o.Fail("max_in_flight", "must be in [1, 1024]")
	}
	w.client = &http.Client{Timeout: timeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return w, nil
}

// Committer implements pipeline.Sink: the webhook is not transactional.
func (w *Webhook) Committer() pipeline.SinkCommitter { return nil }

// Open implements pipeline.Sink.
func (w *Webhook) Open(ctx context.Context, sc pipeline.SinkContext) (pipeline.SinkWriter, error) {
	return &webhookWriter{w: w, job: sc.Tenant + "/" + sc.Job, seen: map[[32]byte]int{}, sem: make(chan struct{}, w.inFlight)}, nil
}

// DeliveryError is a record the receiver refused for good, or that ran out of attempts.
type DeliveryError struct {
	Status    int
	Attempts  int
	Retryable bool
	Err       error
}

func (e *DeliveryError) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("webhook answered %d after %d attempt(s)", e.Status, e.Attempts)
	}
	return fmt.Sprintf("webhook failed after %d attempt(s): %v", e.Attempts, e.Err)
}

func (e *DeliveryError) Unwrap() error { return e.Err }

type webhookWriter struct {
	w    *Webhook
	job  string
	seen map[[32]byte]int // ordinal of identical records within a checkpoint interval
	sem  chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	err  error
}

// key derives a record's idempotency key.
func (ww *webhookWriter) key(r *pipeline.SinkRecord) string {
	h := sha256.New()
	h.Write([]byte(ww.job))
	h.Write([]byte{0})
	h.Write([]byte(ww.w.name))
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(r.Pos))
	binary.BigEndian.PutUint64(b[8:], uint64(r.TS))
	h.Write(b[:])
	h.Write(r.Value)
	var id [32]byte
	h.Sum(id[:0])
	n := ww.seen[id]
	ww.seen[id] = n + 1
	return hex.EncodeToString(id[:16]) + "-" + strconv.Itoa(n)
}

func (ww *webhookWriter) failure() error {
	ww.mu.Lock()
	defer ww.mu.Unlock()
	return ww.err
}

func (ww *webhookWriter) Write(ctx context.Context, recs []pipeline.SinkRecord) error {
	for i := range recs {
		if err := ww.failure(); err != nil {
			return err
		}
		key := ww.key(&recs[i])
		body := bytes.Clone(recs[i].Value)
		select {
		case ww.sem <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		ww.wg.Add(1)
		go func() {
			defer ww.wg.Done()
			defer func() { <-ww.sem }()
			if err := ww.w.deliver(ctx, key, body); err != nil {
				ww.mu.Lock()
				if ww.err == nil {
					ww.err = err
				}
				ww.mu.Unlock()
			}
		}()
	}
	return nil
}

// deliver sends one record, retrying network errors, 429 and 5xx with jittered exponential
// backoff (a Retry-After of the receiver is honoured, up to max_backoff).
func (w *Webhook) deliver(ctx context.Context, key string, body []byte) error {
	backoff := w.backoff
	for attempt := 1; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, w.method, w.url, bytes.NewReader(body))
		if err != nil {
			return &DeliveryError{Attempts: attempt, Err: err}
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := w.client.Do(req)
		status, wait := 0, time.Duration(0)
		if err == nil {
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			status = resp.StatusCode
			if status < 300 {
				return nil
			}
			if s, perr := strconv.Atoi(resp.Header.Get("Retry-After")); perr == nil && s >= 0 {
				wait = time.Duration(s) * time.Second
			}
		}
		retryable := err != nil || status == http.StatusTooManyRequests || status >= 500
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !retryable || attempt >= w.maxAttempts {
			return &DeliveryError{Status: status, Attempts: attempt, Retryable: retryable, Err: err}
		}
		if wait == 0 {
			wait = backoff/2 + rand.N(backoff/2+1)
			backoff = min(2*backoff, w.maxBackoff)
		}
		t := time.NewTimer(min(wait, w.maxBackoff))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// PreCommit waits for every request in flight: a checkpoint covers only delivered records.
func (ww *webhookWriter) PreCommit(ctx context.Context, checkpoint uint64) ([]byte, error) {
	ww.wg.Wait()
	clear(ww.seen)
	return nil, ww.failure()
}

func (ww *webhookWriter) Close(ctx context.Context) error {
	ww.wg.Wait()
	return ww.failure()
}
