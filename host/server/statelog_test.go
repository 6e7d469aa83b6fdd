package server

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/control"
	"github.com/clink-wasm/clink-wasm/host/state"
	"github.com/clink-wasm/clink-wasm/internal/s3test"
)

// refuseLists is an S3 transport that, once armed, answers every object listing with 403
// AccessDenied (a permanent error: no retries) and passes everything else on.
type refuseLists struct {
	base    http.RoundTripper
	armed   atomic.Bool
	refused atomic.Int64
}

func (f *refuseLists) RoundTrip(req *http.Request) (*http.Response, error) {
	if f.armed.Load() && req.Method == http.MethodGet && req.URL.Query().Has("list-type") {
		f.refused.Add(1)
		if req.Body != nil {
			req.Body.Close()
		}
		body := `<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code><Message>injected fault: listing refused</Message></Error>`
		return &http.Response{
			StatusCode: 403, Status: "403 Forbidden", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Request: req,
			Header: http.Header{"Content-Type": {"application/xml"}}, Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body)),
		}, nil
	}
	return f.base.RoundTrip(req)
}

// TestStateBackgroundFailureReachesThePipeline: a failure of a hosted pipeline's state pool in
// the background (its garbage collector's listing refused by S3, through a faulty transport
// around the real client) shows in that pipeline's errors view, naming the operator, and in the
// server's log with the pipeline's id; the pipeline runs on (the collector retries).
func TestStateBackgroundFailureReachesThePipeline(t *testing.T) {
	ep, bucket, ok := s3test.Endpoint(t)
	if !ok {
		t.Skip(s3test.Missing)
	}
	ctx := context.Background()
	dataURL := "s3://" + bucket + "/statelog-test-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "?endpoint=" + ep + "&path_style=true"
	st, err := control.OpenStore(ctx, dataURL, control.S3Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := control.Open(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	faulty := &refuseLists{base: http.DefaultTransport.(*http.Transport).Clone()}
	logs := &bytes.Buffer{}
	srv, _, err := New(ctx, ctl, Config{AdminToken: testAdmin, DataURL: dataURL, RunDir: t.TempDir(),
		Logger: slog.New(slog.NewJSONHandler(&syncWriter{w: logs}, nil)),
		StateOptions: []state.Option{
			state.WithS3(state.S3Options{HTTPClient: &http.Client{Transport: faulty}}),
			state.WithGCInterval(10 * time.Millisecond), // collect after (almost) every commit
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close(ctx) })
	e := &env{t: t, srv: srv, ctl: ctl, http: srv.Handler(), logs: logs}
	tok := e.tenant("acme", map[string]any{"api_requests_per_second": 1000000})
	if r := e.upload(tok, "?name=counter", fixture(t, "counter.wasm")); r.code != 201 {
		t.Fatalf("upload: %d %s", r.code, r.body)
	}
	p := e.startPipeline(tok, "clicks", runtimeSpecFor("counter"))
	base := "/api/v1/pipelines/" + p.ID
	e.ingest(tok, p.ID, records(5, 2, 0))
	waitFor(t, "10 outputs", func() bool { return len(outputLines(e, tok, p.ID)) >= 10 })
	type errorsView struct {
		Items []CapturedError
	}
	var before errorsView
	e.do("GET", base+"/errors", tok, "", nil).decode(t, &before)
	if len(before.Items) != 0 {
		t.Fatalf("errors before the fault: %+v", before.Items)
	}

	faulty.armed.Store(true) // from now on the collector cannot list the pool
	var got CapturedError
	waitFor(t, "the collector's failure in the pipeline's errors", func() bool {
		var v errorsView
		e.do("GET", base+"/errors", tok, "", nil).decode(t, &v)
		for _, ce := range v.Items {
			if strings.Contains(ce.Message, "garbage collection failed") {
				got = ce
				return true
			}
		}
		return false
	})
	faulty.armed.Store(false)
	if !strings.Contains(got.Error, "injected fault: listing refused") || (got.Operator != "count" && !strings.HasSuffix(got.Operator, ".count")) {
		t.Fatalf("captured %+v: want the injected S3 error and the operator", got)
	}
	if faulty.refused.Load() == 0 {
		t.Fatal("the transport refused no listing, yet a failure was captured")
	}
	var line string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "garbage collection failed") {
			line = l
			break
		}
	}
	if !strings.Contains(line, `"pipeline":"`+p.ID+`"`) || !strings.Contains(line, `"tenant":"acme"`) || !strings.Contains(line, "injected fault") {
		t.Fatalf("server log line %q: want the pipeline, its tenant and the error", line)
	}
	// A background failure does not fail the pipeline.
	var now PipelineView
	e.do("GET", base, tok, "", nil).decode(t, &now)
	if now.State != "running" || now.Run == nil || now.Run.State != "running" {
		t.Fatalf("after the background failure: state %s, run %+v", now.State, now.Run)
	}
	if r := e.do("POST", base+"/records", tok, "application/x-ndjson", records(5, 1, 2)); r.code != 200 {
		t.Fatalf("ingest after the failure: %d %s", r.code, r.body)
	}
	waitFor(t, "15 outputs", func() bool { return len(outputLines(e, tok, p.ID)) >= 15 })
}
