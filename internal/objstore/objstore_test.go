package objstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/clink-wasm/clink-wasm/internal/s3test"
)

// pools returns every pool kind to run a conformance test on: mem, file, and S3 when the
// loopback test server is up (scripts/with-s3.sh; under CI=true its absence fails).
func pools(t *testing.T) map[string]Store {
	t.Helper()
	f, err := OpenFile(t.TempDir(), FileOptions{Fsync: true, ImmutableSuffix: ".seg", MaxOpenFiles: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	ps := map[string]Store{"mem": NewMem(), "file": f}
	if s := testS3(t, S3Options{}); s != nil {
		ps["s3"] = s
	}
	return ps
}

func testS3(t *testing.T, o S3Options) *S3 {
	t.Helper()
	ep, bucket, ok := s3test.Endpoint(t)
	if !ok {
		return nil
	}
	o.Endpoint, o.PathStyle = ep, true
	s, err := OpenS3(context.Background(), bucket, fmt.Sprintf("objstore/%s-%d-%d", strings.ReplaceAll(t.Name(), "/", "_"), os.Getpid(), time.Now().UnixNano()), o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestConditionalPuts: create-only and replace-if-ETag on every pool, and the ETags that Put,
// Read and Head report agree.
func TestConditionalPuts(t *testing.T) {
	ctx := context.Background()
	for kind, st := range pools(t) {
		t.Run(kind, func(t *testing.T) {
			e1, err := st.Put(ctx, "c/obj", []byte("one"), Cond{IfAbsent: true})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := st.Put(ctx, "c/obj", []byte("two"), Cond{IfAbsent: true}); !errors.Is(err, ErrPrecondition) {
				t.Fatalf("create over an existing object: %v", err)
			}
			if _, err := st.Put(ctx, "c/obj", []byte("two"), Cond{IfMatch: `"stale"`}); !errors.Is(err, ErrPrecondition) {
				t.Fatalf("replace with a stale ETag: %v", err)
			}
			b, e, err := st.Read(ctx, "c/obj")
			if err != nil || string(b) != "one" || e != e1 {
				t.Fatalf("read: %q %q %v, want one %q", b, e, err, e1)
			}
			e2, err := st.Put(ctx, "c/obj", []byte("two"), Cond{IfMatch: e1})
			if err != nil || e2 == e1 {
				t.Fatalf("replace with the current ETag: %q %v", e2, err)
			}
			if _, err := st.Put(ctx, "c/obj", []byte("three"), Cond{IfMatch: e1}); !errors.Is(err, ErrPrecondition) {
				t.Fatalf("replace with the previous ETag: %v", err)
			}
			if in, err := st.Head(ctx, "c/obj"); err != nil || in.ETag != e2 || in.Size != 3 {
				t.Fatalf("head: %+v %v, want ETag %q size 3", in, err, e2)
			}
			// If-Match on a missing object fails (S3: 404; the local pools: a failed condition).
			if _, err := st.Put(ctx, "c/gone", []byte("x"), Cond{IfMatch: e2}); err == nil {
				t.Fatal("If-Match on a missing object succeeded")
			}
			// Unconditional writes always land.
			if _, err := st.Put(ctx, "c/obj", []byte("four"), Cond{}); err != nil {
				t.Fatal(err)
			}
			if b, _, _ := st.Read(ctx, "c/obj"); string(b) != "four" {
				t.Fatalf("after an unconditional put: %q", b)
			}
		})
	}
}

// TestRangedGets: every pool serves byte ranges, to the end, empty ranges, and reports a
// missing object as ErrNotFound (permanent) and a range past the end as an error.
func TestRangedGets(t *testing.T) {
	ctx := context.Background()
	data := []byte("0123456789abcdef")
	for kind, st := range pools(t) {
		t.Run(kind, func(t *testing.T) {
			for _, name := range []string{"r/obj", "r/obj.seg"} { // .seg: the file pool's cached path
				if _, err := st.Put(ctx, name, data, Cond{}); err != nil {
					t.Fatal(err)
				}
				for _, c := range []struct {
					off, n int64
					want   string
				}{{0, -1, string(data)}, {3, 4, "3456"}, {10, -1, "abcdef"}, {14, 100, "ef"}, {5, 0, ""}} {
					got, err := st.Get(ctx, name, c.off, c.n)
					if err != nil || string(got) != c.want {
						t.Errorf("%s [%d,+%d): %q %v, want %q", name, c.off, c.n, got, err, c.want)
					}
				}
			}
			if kind != "s3" { // S3 answers 416 for a range at or past the end; the local pools serve
				// an empty range at the end and refuse one past it
				if got, err := st.Get(ctx, "r/obj", 16, -1); err != nil || len(got) != 0 {
					t.Errorf("empty range at the end: %q %v", got, err)
				}
				if _, err := st.Get(ctx, "r/obj", 17, 1); err == nil {
					t.Error("a range past the end was served")
				}
			}
			_, err := st.Get(ctx, "r/missing", 0, -1)
			if !errors.Is(err, ErrNotFound) || IsRetryable(err) {
				t.Errorf("missing object: %v (retryable %v)", err, IsRetryable(err))
			}
			if _, _, err := st.Read(ctx, "r/missing"); !errors.Is(err, ErrNotFound) {
				t.Errorf("read of a missing object: %v", err)
			}
			if _, err := st.Head(ctx, "r/missing"); !errors.Is(err, ErrNotFound) {
				t.Errorf("head of a missing object: %v", err)
			}
		})
	}
}

// TestListDelete: List sees exactly the names under a prefix; Delete is idempotent.
func TestListDelete(t *testing.T) {
	ctx := context.Background()
	for kind, st := range pools(t) {
		t.Run(kind, func(t *testing.T) {
			for _, n := range []string{"l/a/1", "l/a/2", "l/ab/3", "l/b/4"} {
				if _, err := st.Put(ctx, n, []byte(n), Cond{}); err != nil {
					t.Fatal(err)
				}
			}
			names := func(prefix string) []string {
				ins, err := st.List(ctx, prefix)
				if err != nil {
					t.Fatal(err)
				}
				var out []string
				for _, in := range ins {
					if in.Size != int64(len(in.Name)) {
						t.Errorf("%s: size %d", in.Name, in.Size)
					}
					out = append(out, in.Name)
				}
				slices.Sort(out)
				return out
			}
			if got := names("l/a"); !slices.Equal(got, []string{"l/a/1", "l/a/2", "l/ab/3"}) {
				t.Errorf("list l/a: %v", got)
			}
			if got := names("l/a/"); !slices.Equal(got, []string{"l/a/1", "l/a/2"}) {
				t.Errorf("list l/a/: %v", got)
			}
			if err := st.Delete(ctx, "l/a/1"); err != nil {
				t.Fatal(err)
			}
			if err := st.Delete(ctx, "l/a/1"); err != nil {
				t.Fatalf("deleting twice: %v", err)
			}
			if got := names("l/"); !slices.Equal(got, []string{"l/a/2", "l/ab/3", "l/b/4"}) {
				t.Errorf("after delete: %v", got)
			}
		})
	}
}

// TestBadNames: one name rule on every pool; nothing is written for a refused name.
func TestBadNames(t *testing.T) {
	ctx := context.Background()
	for kind, st := range pools(t) {
		t.Run(kind, func(t *testing.T) {
			for _, bad := range []string{"", "/abs", "../up", "a/../b", "a//b", ".hidden", "a/.tmp-x", "a\\b", "a\x00b", "a/"} {
				if _, err := st.Put(ctx, bad, []byte("x"), Cond{}); err == nil {
					t.Errorf("name %q accepted", bad)
				}
			}
			if ins, err := st.List(ctx, ""); err != nil || len(ins) != 0 {
				t.Errorf("after refused puts: %v %v", ins, err)
			}
		})
	}
}

// TestFilePrivate: a private file pool creates its directories 0700 and its files 0600; the
// default is 0755 and 0644. Usage counts the files under a directory, temporaries included.
func TestFilePrivate(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		private   bool
		dir, file os.FileMode
	}{{true, 0o700, 0o600}, {false, 0o755, 0o644}} {
		root := filepath.Join(t.TempDir(), "pool")
		f, err := OpenFile(root, FileOptions{Private: c.private})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Put(ctx, "d/x", []byte("secret"), Cond{IfAbsent: true}); err != nil {
			t.Fatal(err)
		}
		for p, want := range map[string]os.FileMode{root: c.dir, filepath.Join(root, "d"): c.dir, filepath.Join(root, "d", "x"): c.file} {
			st, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			// The umask may clear bits; it never adds any.
			if got := st.Mode().Perm(); got&^want != 0 {
				t.Errorf("private=%v %s: mode %v, want at most %v", c.private, p, got, want)
			}
		}
		if err := os.WriteFile(filepath.Join(root, "d", ".tmp-left"), []byte("12345"), 0o600); err != nil {
			t.Fatal(err)
		}
		if n, objs, err := f.Usage(ctx, "d/"); err != nil || n != 11 || objs != 2 {
			t.Errorf("usage: %d bytes %d files %v, want 11 in 2", n, objs, err)
		}
		if ins, _ := f.List(ctx, "d/"); len(ins) != 1 {
			t.Errorf("list shows temporaries: %v", ins)
		}
		if _, _, err := f.Usage(ctx, "../"); err == nil {
			t.Error("usage of a prefix outside the root accepted")
		}
		f.Close()
	}
}

// TestFileConcurrentReplaces: concurrent If-Match replaces of one object, across two pools on
// the same directory (two processes, as far as the lock goes): exactly one wins each round.
func TestFileConcurrentReplaces(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	a, _ := OpenFile(root, FileOptions{})
	b, _ := OpenFile(root, FileOptions{})
	etag, err := a.Put(ctx, "head", []byte("0"), Cond{IfAbsent: true})
	if err != nil {
		t.Fatal(err)
	}
	for round := 1; round <= 20; round++ {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var wins []string
		for i := range 8 {
			st := []*File{a, b}[i%2]
			wg.Add(1)
			go func() {
				defer wg.Done()
				e, err := st.Put(ctx, "head", fmt.Appendf(nil, "%d/%d", round, i), Cond{IfMatch: etag})
				if err == nil {
					mu.Lock()
					wins = append(wins, e)
					mu.Unlock()
				} else if !errors.Is(err, ErrPrecondition) {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		if len(wins) != 1 {
			t.Fatalf("round %d: %d winners", round, len(wins))
		}
		etag = wins[0]
	}
}

// waitingCtx tells when the code under test first selects on it, so a test cancels it only
// once a wait has begun.
type waitingCtx struct {
	context.Context
	calls   atomic.Int32
	waiting chan struct{}
}

func (c *waitingCtx) Done() <-chan struct{} {
	if c.calls.Add(1) == 1 {
		close(c.waiting)
	}
	return c.Context.Done()
}

// TestFileLockWaitEnds: a replace that waits for the pool's lock (another pool on the same
// directory holds it, as a stopped process would) ends when its context does, with that
// cause and without touching the object; once the lock is free, the same replace succeeds. A
// replace waiting behind another in the same pool ends likewise.
func TestFileLockWaitEnds(t *testing.T) {
	root := t.TempDir()
	a, _ := OpenFile(root, FileOptions{Fsync: true})
	b, _ := OpenFile(root, FileOptions{Fsync: true})
	etag, err := a.Put(context.Background(), "head", []byte("0"), Cond{IfAbsent: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, holder := range []*File{b, a} {
		unlock, err := holder.lock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		base, cancel := context.WithCancelCause(context.Background())
		ctx := &waitingCtx{Context: base, waiting: make(chan struct{})}
		done := make(chan error, 1)
		go func() {
			_, err := a.Put(ctx, "head", []byte("1"), Cond{IfMatch: etag})
			done <- err
		}()
		<-ctx.waiting
		stop := errors.New("the test gave up")
		cancel(stop)
		err = <-done
		if err == nil || errors.Is(err, ErrPrecondition) || !errors.Is(err, stop) {
			t.Fatalf("holder %p: a replace waiting for the lock returned %v, want the context's cause", holder, err)
		}
		if got, _, _ := a.Read(context.Background(), "head"); string(got) != "0" {
			t.Fatalf("holder %p: the object is %q after a replace that gave up, want %q", holder, got, "0")
		}
		unlock()
	}
	if etag, err = a.Put(context.Background(), "head", []byte("2"), Cond{IfMatch: etag}); err != nil {
		t.Fatalf("the replace after the lock was freed: %v", err)
	}
	if got, _, _ := b.Read(context.Background(), "head"); string(got) != "2" {
		t.Fatalf("after the replace the object is %q, want %q", got, "2")
	}
}

// TestS3ErrorClasses: the S3 pool's classification of SDK errors into failed conditions,
// missing objects, and retryable or permanent failures.
func TestS3ErrorClasses(t *testing.T) {
	resp := func(status int) error {
		return &awshttp.ResponseError{ResponseError: &smithyhttp.ResponseError{
			Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}},
			Err:      fmt.Errorf("status %d", status),
		}}
	}
	api := func(code string) error { return &smithy.GenericAPIError{Code: code, Message: code} }
	for _, c := range []struct {
		name                  string
		err                   error
		precond, notFound, re bool
	}{
		{"412", resp(412), true, false, false},
		{"PreconditionFailed", api("PreconditionFailed"), true, false, false},
		{"404", resp(404), false, true, false},
		{"NoSuchKey", api("NoSuchKey"), false, true, false},
		{"500", resp(500), false, false, true},
		{"503", resp(503), false, false, true},
		{"429", resp(429), false, false, true},
		{"409", resp(409), false, false, true},
		{"SlowDown", api("SlowDown"), false, false, true},
		{"RequestTimeout", api("RequestTimeout"), false, false, true},
		{"reset", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, false, false, true},
		{"short body", fmt.Errorf("read body: %w", io.ErrUnexpectedEOF), false, false, true},
		{"deadline", context.DeadlineExceeded, false, false, true},
		{"403", resp(403), false, false, false},
		{"AccessDenied", api("AccessDenied"), false, false, false},
		{"400", resp(400), false, false, false},
		{"cancelled", context.Canceled, false, false, false},
	} {
		got := s3Err("get", "x", c.err)
		if errors.Is(got, ErrPrecondition) != c.precond || errors.Is(got, ErrNotFound) != c.notFound || IsRetryable(got) != c.re {
			t.Errorf("%s: %v: precondition %v not-found %v retryable %v, want %v %v %v", c.name, got,
				errors.Is(got, ErrPrecondition), errors.Is(got, ErrNotFound), IsRetryable(got), c.precond, c.notFound, c.re)
		}
		if !c.precond && !errors.Is(got, c.err) {
			t.Errorf("%s: the cause is lost: %v", c.name, got)
		}
	}
}

// faultyTransport fails the first fail requests in the way kind names, then passes them on.
type faultyTransport struct {
	base http.RoundTripper
	mu   sync.Mutex
	fail int
	kind string // "reset", "503", "short"
	seen int
}

func (f *faultyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	f.mu.Lock()
	f.seen++
	fault := f.fail > 0
	if fault {
		f.fail--
	}
	f.mu.Unlock()
	if !fault {
		return f.base.RoundTrip(req)
	}
	switch f.kind {
	case "reset":
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	case "503":
		if req.Body != nil {
			req.Body.Close()
		}
		return &http.Response{StatusCode: 503, Status: "503 Service Unavailable", Header: http.Header{},
			Body: io.NopCloser(strings.NewReader("<Error><Code>ServiceUnavailable</Code></Error>")), Request: req}, nil
	default: // "short": the headers arrive, the body breaks off
		resp, err := f.base.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(b[:len(b)/2]))
		return resp, nil
	}
}

// TestS3Retries, against the loopback server: transient faults (connection resets, 503s, a
// body that breaks off) within the attempt budget are ridden out; beyond it the error is
// reported as retryable; a failed condition is never retried.
func TestS3Retries(t *testing.T) {
	ctx := context.Background()
	ft := &faultyTransport{base: http.DefaultTransport.(*http.Transport).Clone()}
	st := testS3(t, S3Options{HTTPClient: &http.Client{Transport: ft}, Attempts: 3, MaxBackoff: 5 * time.Millisecond, Timeout: 5 * time.Second})
	if st == nil {
		t.Skip(s3test.Missing)
	}
	etag, err := st.Put(ctx, "obj", []byte("payload-payload"), Cond{IfAbsent: true})
	if err != nil {
		t.Fatal(err)
	}
	set := func(kind string, fail int) {
		ft.mu.Lock()
		ft.kind, ft.fail, ft.seen = kind, fail, 0
		ft.mu.Unlock()
	}
	for _, kind := range []string{"reset", "503", "short"} {
		set(kind, 2)
		if b, err := st.Get(ctx, "obj", 0, -1); err != nil || string(b) != "payload-payload" {
			t.Errorf("%s, 2 faults: %q %v", kind, b, err)
		}
		if b, e, err := st.Read(ctx, "obj"); err != nil || string(b) != "payload-payload" || e != etag {
			t.Errorf("%s, read after faults: %q %q %v", kind, b, e, err)
		}
		set(kind, 1000)
		_, err := st.Get(ctx, "obj", 0, -1)
		if err == nil || !IsRetryable(err) {
			t.Errorf("%s, persistent faults: %v (retryable %v), want a retryable error", kind, err, IsRetryable(err))
		}
	}
	set("503", 2)
	if _, err := st.Put(ctx, "obj2", []byte("x"), Cond{IfAbsent: true}); err != nil {
		t.Errorf("put through 2 faults: %v", err)
	}
	set("", 0)
	if _, err := st.Put(ctx, "obj", []byte("x"), Cond{IfAbsent: true}); !errors.Is(err, ErrPrecondition) {
		t.Fatalf("create over an existing object: %v", err)
	}
	ft.mu.Lock()
	seen := ft.seen
	ft.mu.Unlock()
	if seen != 1 {
		t.Errorf("a failed condition was sent %d times, want once", seen)
	}
}
