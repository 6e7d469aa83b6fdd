package pipeline

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/lookup"
	"github.com/clink-wasm/clink-wasm/host/scheduler"
	"github.com/clink-wasm/clink-wasm/host/state"
)

func abiFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "abi", "testdata", name+".wasm"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// withManifest returns the counter with another manifest embedded: same code, another sha256.
func withManifest(t testing.TB, bin []byte, manifest string) []byte {
	t.Helper()
	nb, err := abi.EmbedManifest(bin, []byte(manifest))
	if err != nil {
		t.Fatal(err)
	}
	return nb
}

var poolSeq atomic.Int64

// memPool returns a named mem:// pool of its own: it outlives one Run, so restores can be tested
// in process.
func newMemPool(t testing.TB) string {
	return fmt.Sprintf("mem://%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), poolSeq.Add(1))
}

// run runs opts over input and returns the output.
func runOpts(t testing.TB, opts Options, input string) (string, *Summary, error) {
	t.Helper()
	var out bytes.Buffer
	opts.Input, opts.Output = strings.NewReader(input), &out
	sum, err := Run(context.Background(), opts)
	if sum == nil {
		t.Fatal("Run returned no summary")
	}
	return out.String(), sum, err
}

const twoA = "{\"u\":\"a\"}\n{\"u\":\"b\"}\n{\"u\":\"a\"}\n"

func TestRunCounter(t *testing.T) {
	out, sum, err := runOpts(t, Options{Module: abiFixture(t, "counter"), KeyField: "u"}, twoA)
	if err != nil {
		t.Fatal(err)
	}
	if err := interleaving(out, counts(1, 2), counts(1)); err != nil {
		t.Fatal(err)
	}
	if sum.Operator != "counter" || sum.RecordsIn != 3 || sum.RecordsOut != 3 || sum.Skipped != 0 || sum.MaxInFlight < 1 ||
		len(sum.Checkpoints) != 0 || sum.Resumable || sum.Restored != nil || sum.State != nil {
		t.Fatalf("summary %+v", sum)
	}
	if sum.RecordsPerSecond() < 0 || (&Summary{}).RecordsPerSecond() != 0 {
		t.Fatal("records per second")
	}
}

// TestRunRestore: restores that find nothing fail with what was looked for and where; latest
// continues from the newest checkpoint, skipping what it covers of the same input and reading a
// new input from its start; latest-if-any starts empty when there is none.
func TestRunRestore(t *testing.T) {
	pool := newMemPool(t)
	counter := abiFixture(t, "counter")
	opts := Options{Module: counter, KeyField: "u", StateURL: pool}

	// Nothing there yet.
	opts.Restore = state.RestoreLatest
	_, _, err := runOpts(t, opts, twoA)
	var nce *NoCheckpointError
	if !errors.Is(err, ErrNoCheckpoint) || !errors.As(err, &nce) || nce.Job != "counter" || nce.Pool != pool ||
		!strings.Contains(err.Error(), `no checkpoint of job "counter" in `+pool) {
		t.Fatalf("latest with no checkpoint: %v", err)
	}
	opts.Restore = RestoreLatestIfAny
	out, sum, err := runOpts(t, opts, twoA)
	if err != nil || interleaving(out, counts(1, 2), counts(1)) != nil || sum.Restored == nil || sum.Restored.Checkpoint != 0 ||
		!strings.Contains(sum.Restored.String(), "started from empty state") {
		t.Fatalf("latest-if-any on nothing: %v %q %+v", err, out, sum.Restored)
	}
	if len(sum.Checkpoints) != 1 || sum.Resumable || sum.Position != "the end of the input" {
		t.Fatalf("checkpoints %v resumable %v position %q (a mem:// pool is not resumable by a new process)", sum.Checkpoints, sum.Resumable, sum.Position)
	}
	ids := []uint64{sum.Checkpoints[0]}

	// The same input again: the checkpoint covers all of it.
	opts.Restore = state.RestoreLatest
	if out, sum, err = runOpts(t, opts, twoA); err != nil || out != "" || sum.RecordsIn != 0 || sum.Restored.Checkpoint != ids[0] {
		t.Fatalf("covered input: %v %q %+v", err, out, sum)
	}
	ids = append(ids, sum.Checkpoints...)
	// New inputs: latest and latest-if-any both continue from the newest checkpoint.
	for i, r := range []uint64{state.RestoreLatest, RestoreLatestIfAny} {
		opts.Restore, opts.InputName = r, fmt.Sprintf("batch%d", i)
		out, sum, err = runOpts(t, opts, twoA)
		// Key a's counts in order, key b's anywhere: only per-key order is guaranteed.
		wantA, wantB := [][]string{counts(3, 4), counts(5, 6)}[i], [][]string{counts(2), counts(3)}[i]
		prev := ids[len(ids)-1]
		if err != nil || interleaving(out, wantA, wantB) != nil || sum.Restored == nil || sum.Restored.Checkpoint != prev || sum.Restored.Upgrade ||
			sum.Restored.From == nil || sum.Restored.From.Name != "counter" || sum.Restored.String() != fmt.Sprintf("restored checkpoint %d", prev) {
			t.Fatalf("restore %d: %v %q %+v", i, err, out, sum.Restored)
		}
		if len(sum.Checkpoints) != 1 || sum.Checkpoints[0] <= prev {
			t.Fatalf("restore %d: checkpoints %v after %d", i, sum.Checkpoints, prev)
		}
		ids = append(ids, sum.Checkpoints...)
	}
	// A named checkpoint that exists, one that does not, and the wrong job.
	// (The newest 3 are kept: ids[1] holds what ids[0] did.)
	opts.Restore, opts.InputName = ids[1], "batch9"
	if out, _, err = runOpts(t, opts, "{\"u\":\"a\"}\n"); err != nil || out != "{\"count\":3}\n" {
		t.Fatalf("restore %d: %v %q", ids[1], err, out)
	}
	opts.Restore = 99
	_, _, err = runOpts(t, opts, twoA)
	if !errors.Is(err, ErrNoCheckpoint) || !strings.Contains(err.Error(), `checkpoint 99 of job "counter" is not in `+pool) ||
		!strings.Contains(err.Error(), "it has checkpoints ") || strings.Contains(err.Error(), "mem:// state lives") {
		t.Fatalf("restore 99: %v", err)
	}
	opts.Restore, opts.Job = state.RestoreLatest, "other-job"
	if _, _, err = runOpts(t, opts, twoA); !errors.Is(err, ErrNoCheckpoint) || !strings.Contains(err.Error(), `job "other-job"`) {
		t.Fatalf("wrong job: %v", err)
	}
	// Without a pool there is never anything to restore.
	if _, _, err = runOpts(t, Options{Module: counter, KeyField: "u", Restore: state.RestoreLatest}, twoA); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("no pool: %v", err)
	}
	if out, _, err = runOpts(t, Options{Module: counter, KeyField: "u", Restore: RestoreLatestIfAny}, twoA); err != nil || !strings.HasPrefix(out, "{\"count\":1}") {
		t.Fatalf("no pool, latest-if-any: %v", err)
	}
	// mem:// says why a new process has nothing.
	if got := (&NoCheckpointError{Job: "j", Pool: "mem://", Want: state.RestoreLatest}).Error(); !strings.Contains(got, "mem:// state lives in process memory only") {
		t.Fatalf("mem message: %s", got)
	}
}

// TestRunRestoreOtherModule: a checkpoint records the module that wrote it. A module sharing a state
// name restores it and says it upgraded; one sharing none is refused.
func TestRunRestoreOtherModule(t *testing.T) {
	pool := newMemPool(t)
	counter := abiFixture(t, "counter")
	if _, _, err := runOpts(t, Options{Module: counter, KeyField: "u", StateURL: pool}, twoA); err != nil {
		t.Fatal(err)
	}
	v2 := withManifest(t, counter, `{"abi":1,"name":"counter","states":["count","extra"]}`)
	out, sum, err := runOpts(t, Options{Module: v2, KeyField: "u", StateURL: pool, Restore: state.RestoreLatest, InputName: "b2"}, twoA)
	if err != nil || interleaving(out, counts(3, 4), counts(2)) != nil {
		t.Fatalf("upgrade: %v %q", err, out)
	}
	r := sum.Restored
	if r == nil || !r.Upgrade || !slices.Equal(r.Kept, []string{"count"}) || !slices.Equal(r.Added, []string{"extra"}) || len(r.Dropped) != 0 ||
		r.From.SHA256 == r.Into.SHA256 || r.From.SHA256 != IdentifyModule(counter, "", nil).SHA256 {
		t.Fatalf("restore info %+v", r)
	}
	if s := r.String(); !strings.Contains(s, "an upgrade") || !strings.Contains(s, "state kept: count") || !strings.Contains(s, "new, starting empty: extra") {
		t.Fatalf("upgrade message %q", s)
	}
	// The checkpoint v2 wrote records v2; the original restores it back, dropping "extra".
	_, sum, err = runOpts(t, Options{Module: counter, KeyField: "u", StateURL: pool, Restore: state.RestoreLatest}, twoA)
	if err != nil || !sum.Restored.Upgrade || !slices.Equal(sum.Restored.Dropped, []string{"extra"}) || !strings.Contains(sum.Restored.String(), "not restored (no longer declared): extra") {
		t.Fatalf("downgrade: %v %+v", err, sum.Restored)
	}
	// Nothing in common: refused, naming both modules.
	other := withManifest(t, counter, `{"abi":1,"name":"tally","states":["total"]}`)
	_, _, err = runOpts(t, Options{Module: other, KeyField: "u", StateURL: pool, Job: "counter", Restore: state.RestoreLatest}, twoA)
	if !errors.Is(err, ErrModuleMismatch) || !strings.Contains(err.Error(), "written by module counter (sha256 ") ||
		!strings.Contains(err.Error(), "module tally (sha256 ") || !strings.Contains(err.Error(), "no state in common") {
		t.Fatalf("unrelated module: %v", err)
	}
}

// TestCheckModule: the module checks of a restore.
func TestCheckModule(t *testing.T) {
	// A module record that is not JSON is an error, not a silent restore.
	info := &RestoreInfo{Checkpoint: 3}
	if err := checkModule(info, []byte("{"), ModuleIdentity{}, "j", "p"); err == nil || !strings.Contains(err.Error(), "unreadable module record") {
		t.Fatalf("bad record: %v", err)
	}
	// Two stateless modules may replace each other (timers are all they carry).
	info = &RestoreInfo{Checkpoint: 3}
	prev, _ := json.Marshal(ModuleIdentity{SHA256: "aa", Name: "x"})
	if err := checkModule(info, prev, ModuleIdentity{SHA256: "bb", Name: "y"}, "j", "p"); err != nil || !info.Upgrade {
		t.Fatalf("stateless: %v %+v", err, info)
	}
}

// TestRunCheckpoints: periodic checkpoints while the input lasts, and the final one; with a negative
// interval only the final one.
func TestRunCheckpoints(t *testing.T) {
	var in strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&in, "{\"u\":\"k%d\"}\n", i%10)
	}
	_, sum, err := runOpts(t, Options{Module: abiFixture(t, "counter"), KeyField: "u", StateURL: newMemPool(t), CheckpointEvery: time.Nanosecond}, in.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.Checkpoints) < 2 || !slices.IsSorted(sum.Checkpoints) || sum.CheckpointBytes <= 0 || sum.State == nil {
		t.Fatalf("checkpoints %v, %d bytes", sum.Checkpoints, sum.CheckpointBytes)
	}
	_, sum, err = runOpts(t, Options{Module: abiFixture(t, "counter"), KeyField: "u", StateURL: newMemPool(t), CheckpointEvery: -1}, in.String())
	if err != nil || len(sum.Checkpoints) != 1 {
		t.Fatalf("final only: %v %v", err, sum.Checkpoints)
	}
	// Without a pool, no checkpoint is reported (process memory ends with the run).
	if _, sum, err = runOpts(t, Options{Module: abiFixture(t, "counter"), KeyField: "u"}, twoA); err != nil || len(sum.Checkpoints) != 0 || sum.Resumable {
		t.Fatalf("no pool: %v %v", err, sum.Checkpoints)
	}
}

// TestFileStateAndHotBytes: a file:// pool restores across Runs, with the hot tier bounded by
// Options.HotBytes.
func TestFileStateAndHotBytes(t *testing.T) {
	pool, err := StateURLForDir(t.TempDir())
	if err != nil || !strings.HasPrefix(pool, "file:///") {
		t.Fatal(pool, err)
	}
	opts := Options{Module: abiFixture(t, "counter"), KeyField: "u", StateURL: pool, HotBytes: 1 << 20}
	if _, sum, err := runOpts(t, opts, twoA); err != nil || !sum.Resumable || sum.State == nil || sum.State.HotLimit != 1<<20 {
		t.Fatalf("%v %+v", err, sum)
	}
	opts.Restore, opts.InputName = state.RestoreLatest, "next"
	if out, _, err := runOpts(t, opts, twoA); err != nil || interleaving(out, counts(3, 4), counts(2)) != nil {
		t.Fatalf("%v %q", err, out)
	}
}

func TestOrderInputRefusesKeyedState(t *testing.T) {
	for _, o := range []scheduler.Order{scheduler.OrderInput, scheduler.OrderNone} {
		out, sum, err := runOpts(t, Options{Module: abiFixture(t, "counter"), KeyField: "u", Order: o}, twoA)
		if !errors.Is(err, ErrOrderWithState) || !strings.Contains(err.Error(), `operator "counter" declares keyed state (count)`) ||
			!strings.Contains(err.Error(), "use order key") || out != "" || sum.RecordsIn != 0 {
			t.Fatalf("order %d: %v (out %q)", o, err, out)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	counter := abiFixture(t, "counter")
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{Format: "xml"}, `unknown input format "xml"`},
		{Options{OnMalformed: "ignore"}, `unknown malformed-record policy "ignore"`},
		{Options{MaxInFlight: -1}, "max in flight must be > 0"},
		{Options{Limits: abi.Limits{CallTime: -time.Second}}, "call time limit must be > 0"},
		{Options{Limits: abi.Limits{MemoryPages: 65537}}, "exceeds the wasm32 maximum of 65536"},
		{Options{HotBytes: -1}, "hot bytes must be > 0"},
		{Options{WatermarkDelay: -1}, "watermark delay must be >= 0"},
		{Options{WatermarkEvery: -1}, "records between watermarks"},
		{Options{Order: 9}, "unknown output order 9"},
		{Options{Limits: abi.Limits{MaxRecordValue: -1}}, "record value limit must be > 0"},
		{Options{Restore: state.RestoreLatest}, "process memory (no state pool)"},
		{Options{Limits: abi.Limits{MaxPrefetchValue: -5}}, "prefetch value limit must be > 0"},
	} {
		tc.opts.Module = counter
		if _, _, err := runOpts(t, tc.opts, twoA); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.opts, err, tc.want)
		}
	}
	if _, err := Run(context.Background(), Options{Module: counter}); err == nil || !strings.Contains(err.Error(), "Input and Output are required") {
		t.Errorf("no input: %v", err)
	}
	if orderFlagName(scheduler.OrderNone) != "none" || orderFlagName(7) != "Order(7)" {
		t.Error("orderName")
	}
}

// TestRunFailures: every failure names what failed and where, the records before it are
// written, and errors.Is/As see the cause through every wrap.
func TestRunFailures(t *testing.T) {
	t.Run("guest trap", func(t *testing.T) {
		var log bytes.Buffer
		_, sum, err := runOpts(t, Options{Module: abiFixture(t, "trap"), KeyField: "u", Log: &log}, twoA)
		if err == nil || !strings.Contains(err.Error(), `operator "trapper" failed at input line 1`) || sum.Operator != "trapper" {
			t.Fatalf("%v", err)
		}
		if !strings.Contains(log.String(), "[trapper] error: negative amount (input line 1)") {
			t.Fatalf("guest log %q", log.String())
		}
	})
	t.Run("invalid output", func(t *testing.T) {
		_, _, err := runOpts(t, Options{Module: abiFixture(t, "garbage"), KeyField: "u"}, twoA)
		var oe *OutputError
		var se *json.SyntaxError
		if !errors.As(err, &oe) || oe.Operator != "garbage" || oe.Where != "input line 1" || !errors.As(err, &se) {
			t.Fatalf("%v", err)
		}
	})
	t.Run("malformed input", func(t *testing.T) {
		out, sum, err := runOpts(t, Options{Module: abiFixture(t, "counter"), KeyField: "u"}, "{\"u\":\"a\"}\n{\"u\":\n{\"u\":\"a\"}\n")
		var me *MalformedError
		var se *json.SyntaxError
		if !errors.As(err, &me) || me.Line != 2 || !errors.As(err, &se) || out != "{\"count\":1}\n" || sum.RecordsIn != 1 {
			t.Fatalf("%v %q", err, out)
		}
		var dl bytes.Buffer
		out, sum, err = runOpts(t, Options{Module: abiFixture(t, "counter"), KeyField: "u", OnMalformed: MalformedSkip, DeadLetter: &dl}, "{\"u\":\"a\"}\n{\"u\":\n{\"u\":\"a\"}\n")
		if err != nil || out != "{\"count\":1}\n{\"count\":2}\n" || sum.Skipped != 1 || !strings.Contains(dl.String(), `"line":2`) {
			t.Fatalf("skip: %v %q %d %s", err, out, sum.Skipped, dl.String())
		}
	})
	t.Run("bad event time", func(t *testing.T) {
		_, _, err := runOpts(t, Options{Module: abiFixture(t, "counter"), KeyField: "u", TimeField: "ts"}, "{\"u\":\"a\",\"ts\":\"yesterday\"}\n")
		var pe *time.ParseError
		if !errors.As(err, &pe) || !strings.Contains(err.Error(), `input line 1: field "ts": a time must be`) {
			t.Fatalf("%v", err)
		}
	})
	t.Run("output write fails", func(t *testing.T) {
		var in strings.Builder
		for range 20000 { // more than the sink's buffer, so a write reaches the writer mid-run
			in.WriteString("{\"u\":\"a\"}\n")
		}
		sum, err := Run(context.Background(), Options{Module: abiFixture(t, "counter"), KeyField: "u", Input: strings.NewReader(in.String()), Output: diskFullWriter{}})
		if err == nil || !strings.HasPrefix(err.Error(), "writing output: disk full") || sum.RecordsIn == 0 {
			t.Fatalf("%v", err)
		}
	})
	t.Run("input read fails", func(t *testing.T) {
		in := io.MultiReader(strings.NewReader("{\"u\":\"a\"}\n"), iotestErr{})
		var out bytes.Buffer
		_, err := Run(context.Background(), Options{Module: abiFixture(t, "counter"), KeyField: "u", Input: in, Output: &out})
		if err == nil || !strings.Contains(err.Error(), "reading input: device gone") || out.String() != "{\"count\":1}\n" {
			t.Fatalf("%v %q", err, out.String())
		}
	})
	t.Run("not a module", func(t *testing.T) {
		if _, _, err := runOpts(t, Options{Module: []byte("nope")}, twoA); err == nil || !strings.Contains(err.Error(), "not a WebAssembly module") {
			t.Fatalf("%v", err)
		}
	})
	t.Run("unknown pool scheme", func(t *testing.T) {
		if _, _, err := runOpts(t, Options{Module: abiFixture(t, "counter"), StateURL: "ftp://x"}, twoA); err == nil || !strings.Contains(err.Error(), "state pool ftp://x") {
			t.Fatalf("%v", err)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		// Cancelled mid-run, once two records were read: the run stops with the context's error
		// and takes no final checkpoint.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		in := io.MultiReader(strings.NewReader(twoA), ctxReader{ctx})
		var out bytes.Buffer
		sum, err := Run(ctx, Options{Module: abiFixture(t, "counter"), KeyField: "u", Input: in, Output: &out, StateURL: newMemPool(t),
			Progress: func(p Progress) {
				if p.RecordsIn >= 3 {
					cancel()
				}
			}})
		if !errors.Is(err, context.Canceled) || len(sum.Checkpoints) != 0 {
			t.Fatalf("%v, checkpoints %v", err, sum.Checkpoints)
		}
	})
}

// ctxReader blocks until its context ends, then fails with the context's error.
type ctxReader struct{ ctx context.Context }

func (r ctxReader) Read([]byte) (int, error) {
	<-r.ctx.Done()
	return 0, r.ctx.Err()
}

type panicReader struct{}

func (panicReader) Read([]byte) (int, error) { panic("reader bug") }

// TestSourcePanicIsAnError: a panic while reading the input fails the run; the process lives on.
func TestSourcePanicIsAnError(t *testing.T) {
	var out bytes.Buffer
	_, err := Run(context.Background(), Options{Module: abiFixture(t, "counter"), KeyField: "u",
		Input: io.MultiReader(strings.NewReader(twoA), panicReader{}), Output: &out})
	if err == nil || !strings.Contains(err.Error(), "internal error reading input") || !strings.Contains(err.Error(), "reader bug") {
		t.Fatalf("%v", err)
	}
}

type iotestErr struct{}

func (iotestErr) Read([]byte) (int, error) { return 0, errors.New("device gone") }

// TestRunProgress: the callback sees the bytes and records read so far while the run lasts.
func TestRunProgress(t *testing.T) {
	first := "{\"u\":\"a\"}\n{\"u\":\"b\"}\n"
	release := make(chan struct{})
	var once sync.Once
	var seen Progress
	in := io.MultiReader(strings.NewReader(first), &gatedReader{gate: release, r: strings.NewReader("{\"u\":\"a\"}\n")})
	var out bytes.Buffer
	sum, err := Run(context.Background(), Options{
		Module: abiFixture(t, "counter"), KeyField: "u", Input: in, InputSize: 30, Output: &out,
		Progress: func(p Progress) {
			if p.RecordsIn == 2 {
				once.Do(func() { seen = p; close(release) })
			}
		},
	})
	if err != nil || sum.RecordsIn != 3 || interleaving(out.String(), counts(1, 2), counts(1)) != nil {
		t.Fatalf("%v %q", err, out.String())
	}
	if seen.BytesRead != int64(len(first)) || seen.InputSize != 30 || seen.RecordsIn != 2 || seen.Elapsed <= 0 {
		t.Fatalf("progress %+v", seen)
	}
}

// gatedReader blocks until gate is closed, then reads r.
type gatedReader struct {
	gate <-chan struct{}
	r    io.Reader
}

func (g *gatedReader) Read(p []byte) (int, error) {
	<-g.gate
	return g.r.Read(p)
}

// TestRunLookups: a module's endpoint is served over loopback HTTP, and its metrics are reported.
func TestRunLookups(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.URL.Path != "/api/enrich" {
			http.Error(w, "wrong request", http.StatusNotFound)
			return
		}
		fmt.Fprintf(w, `{"got":%s}`, body)
	}))
	defer srv.Close()
	ep, err := ParseEndpointFlag("svc=" + srv.URL + "/api")
	if err != nil || !ep.Egress.AllowLoopback {
		t.Fatalf("%v %+v", err, ep)
	}
	ep.Methods = []string{"POST"}
	out, sum, err := runOpts(t, Options{Module: abiFixture(t, "enrich"), KeyField: "u", Endpoints: []lookup.EndpointConfig{ep}}, twoA)
	// Per-key order: the two records of key a in order; b may come anywhere.
	if lines := strings.Split(strings.TrimSpace(out), "\n"); err != nil || len(lines) != 3 || calls.Load() != 3 ||
		slices.Index(lines, `{"got":{"u":"b"}}`) < 0 || strings.Count(out, `{"got":{"u":"a"}}`) != 2 {
		t.Fatalf("%v %q", err, out)
	}
	if m, ok := sum.Lookups["svc"]; !ok || m.Requests != 3 {
		t.Fatalf("lookup metrics %+v", sum.Lookups)
	}
	// A stateless module runs under input order, outputs in input order.
	out, _, err = runOpts(t, Options{Module: abiFixture(t, "enrich"), KeyField: "u", Order: scheduler.OrderInput, Endpoints: []lookup.EndpointConfig{ep}}, twoA)
	if err != nil || out != "{\"got\":{\"u\":\"a\"}}\n{\"got\":{\"u\":\"b\"}}\n{\"got\":{\"u\":\"a\"}}\n" {
		t.Fatalf("input order: %v %q", err, out)
	}
	// A GET-only endpoint refuses the guest's POST: the guest sees the code and the run goes on.
	ep.Methods = nil
	out, _, err = runOpts(t, Options{Module: abiFixture(t, "enrich"), KeyField: "u", Endpoints: []lookup.EndpointConfig{ep}}, "{\"u\":\"a\"}\n")
	if err != nil || !strings.HasPrefix(out, "{\"lookup_error\":") {
		t.Fatalf("refused: %v %q", err, out)
	}
	// Configuration errors.
	if _, _, err = runOpts(t, Options{Module: abiFixture(t, "enrich"), Endpoints: []lookup.EndpointConfig{ep, ep}}, twoA); err == nil || !strings.Contains(err.Error(), `endpoint "svc" is defined twice`) {
		t.Fatalf("duplicate: %v", err)
	}
	if _, _, err = runOpts(t, Options{Module: abiFixture(t, "enrich")}, twoA); err == nil || !strings.Contains(err.Error(), `endpoint "svc"`) {
		t.Fatalf("missing: %v", err)
	}
	bad := lookup.EndpointConfig{Name: "svc", BaseURL: "ftp://x"}
	if _, _, err = runOpts(t, Options{Module: abiFixture(t, "enrich"), Endpoints: []lookup.EndpointConfig{bad}}, twoA); err == nil || !strings.Contains(err.Error(), `endpoint "svc": `) {
		t.Fatalf("bad endpoint: %v", err)
	}
}

func TestEndpointConfigParsing(t *testing.T) {
	for _, tc := range []struct {
		in       string
		loopback bool
		err      string
	}{
		{"geo=https://geo.example/v1", false, ""},
		{"geo=http://localhost:8080", true, ""},
		{"geo=http://[::1]:8080", true, ""},
		{"geo=http://127.0.0.2", true, ""},
		{"geo", false, "want NAME=URL"},
		{"=http://x", false, "want NAME=URL"},
		{"geo=ftp://x", false, "is not an http(s) URL"},
		{"geo=http://", false, "is not an http(s) URL"},
	} {
		c, err := ParseEndpointFlag(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v", tc.in, err)
			}
			continue
		}
		if err != nil || c.Name != "geo" || c.Egress.AllowLoopback != tc.loopback {
			t.Errorf("%s: %+v %v", tc.in, c, err)
		}
	}
	if got := EndpointNames([]lookup.EndpointConfig{{Name: "a"}, {Name: "b"}}); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("names %v", got)
	}
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(s), 0o644)
		return p
	}
	if l, err := LoadEndpoints(write("a.json", `[{"name":"a","base_url":"http://x"}]`)); err != nil || len(l) != 1 || l[0].Name != "a" {
		t.Errorf("array: %v %v", l, err)
	}
	if l, err := LoadEndpoints(write("b.json", `{"endpoints":[{"name":"b","base_url":"http://x"}]}`)); err != nil || len(l) != 1 || l[0].Name != "b" {
		t.Errorf("object: %v %v", l, err)
	}
	var se *json.SyntaxError
	if _, err := LoadEndpoints(write("c.json", `{`)); err == nil || !strings.Contains(err.Error(), "c.json") || !errors.As(err, &se) {
		t.Errorf("bad JSON: %v", err)
	}
	if _, err := LoadEndpoints(filepath.Join(dir, "missing.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing: %v", err)
	}
}

func TestParseRestoreAndSizes(t *testing.T) {
	for in, want := range map[string]uint64{"": 0, "none": 0, "latest": state.RestoreLatest, "LATEST": state.RestoreLatest,
		"latest-if-any": RestoreLatestIfAny, "7": 7} {
		if got, err := ParseRestore(in); err != nil || got != want {
			t.Errorf("ParseRestore(%q) = %d, %v", in, got, err)
		}
	}
	for _, in := range []string{"0", "-1", "yesterday", "18446744073709551614", "18446744073709551615"} {
		if _, err := ParseRestore(in); err == nil {
			t.Errorf("ParseRestore(%q) accepted", in)
		}
	}
	for in, want := range map[string]int64{"0": 0, "1048576": 1 << 20, "64k": 64 << 10, "8m": 8 << 20, "8M": 8 << 20, "2g": 2 << 30, "1GiB": 1 << 30, "3MiB": 3 << 20, " 5k ": 5 << 10} {
		if got, err := ParseByteSize(in); err != nil || got != want {
			t.Errorf("ParseByteSize(%q) = %d, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "-1", "1.5m", "m", "10x", "9999999999999g"} {
		if _, err := ParseByteSize(in); err == nil || !strings.Contains(err.Error(), "bad size") {
			t.Errorf("ParseByteSize(%q): %v", in, err)
		}
	}
}

// TestStateURLRedaction: credentials in a state URL, in its userinfo or in the URL of its S3 endpoint,
// never reach a message.
func TestStateURLRedaction(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"s3://b/p?endpoint=http://user:hunter22@127.0.0.1:1&path_style=true", "s3://b/p?endpoint=http://user:xxxxx@127.0.0.1:1&path_style=true"},
		{"s3://AKID:s3cretkey@b/p", "s3://AKID:xxxxx@b/p"},
		{"s3://b/p?endpoint=http%3A%2F%2Fuser%3Ahunter22%40127.0.0.1%3A1", "s3://b/p?endpoint=http%3A%2F%2Fuser%3Axxxxx%40127.0.0.1%3A1"},
		{"file:///tmp/x", "file:///tmp/x"},
		{"s3://b/p?endpoint=http://127.0.0.1:1", "s3://b/p?endpoint=http://127.0.0.1:1"},
		{"s3://b/%zz?endpoint=http://u:p@h", "(unparsable URL)"},
	} {
		if got := redactURL(tc.in); got != tc.want {
			t.Errorf("redactURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	raw := "s3://b/p?endpoint=http://user:hunter22@127.0.0.1:1"
	inner := fmt.Errorf("Get %q: refused: %w", "http://user:hunter22@127.0.0.1:1/b", context.DeadlineExceeded)
	err := redactErr(inner, raw)
	if strings.Contains(err.Error(), "hunter22") || !strings.Contains(err.Error(), "user:xxxxx@127.0.0.1") || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("redactErr: %v", err)
	}
	if redactErr(nil, raw) != nil || redactErr(io.EOF, raw) != io.EOF {
		t.Fatal("redactErr changed an error without secrets")
	}
}

// TestUnreachableS3Redacted: an S3 pool whose endpoint refuses connections fails the run with a
// message that names the pool without its credentials. Loopback only: port 1 refuses at once.
func TestUnreachableS3Redacted(t *testing.T) {
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true") // never try the instance metadata service
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "envsecretkey")
	t.Setenv("AWS_REGION", "us-east-1")
	for _, pool := range []string{
		"s3://bucket/prefix?endpoint=http://user:hunter22pass@127.0.0.1:1&path_style=true&max_attempts=1",
		"s3://AKIDURL:urlsecretkey@bucket/prefix?endpoint=http://127.0.0.1:1&path_style=true&max_attempts=1",
	} {
		_, _, err := runOpts(t, Options{Module: abiFixture(t, "counter"), KeyField: "u", StateURL: pool}, twoA)
		if err == nil || !strings.Contains(err.Error(), "state pool s3://") || !strings.Contains(err.Error(), "connection refused") {
			t.Fatalf("%s: %v", pool, err)
		}
		for _, secret := range []string{"hunter22pass", "urlsecretkey", "envsecretkey"} {
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("the error shows a secret: %v", err)
			}
		}
	}
}

// TestRunLargeInputKeys: keys and values of records read in one batch stay intact when the
// parser's buffer is refilled (inputs beyond one buffer of the reader), CSV included.
func TestRunLargeInputKeys(t *testing.T) {
	for _, format := range []Format{FormatJSONL, FormatCSV} {
		var in strings.Builder
		if format == FormatCSV {
			in.WriteString("u,pad\n")
		}
		want := map[string]int{}
		for i := range 30000 {
			k := fmt.Sprintf("key-%d", (i*7919)%997)
			want[k]++
			if format == FormatCSV {
				fmt.Fprintf(&in, "%s,%s\n", k, strings.Repeat("x", i%40))
			} else {
				fmt.Fprintf(&in, "{\"u\":%q,\"pad\":%q}\n", k, strings.Repeat("x", i%40))
			}
		}
		out, sum, err := runOpts(t, Options{Module: abiFixture(t, "counter"), KeyField: "u", Format: format, StateURL: newMemPool(t)}, in.String())
		if err != nil || sum.RecordsIn != 30000 || sum.RecordsOut != 30000 {
			t.Fatalf("%s: %v %+v", format, err, sum)
		}
		// The counter counts per key: the largest count of each key is its number of records,
		// and the counts seen are exactly 1..n per key only if every record had its own key.
		hist := map[int]int{}
		for l := range strings.Lines(out) {
			var v struct{ Count int }
			if err := json.Unmarshal([]byte(l), &v); err != nil {
				t.Fatalf("%s: %q", format, l)
			}
			hist[v.Count]++
		}
		wantHist := map[int]int{}
		for _, n := range want {
			for c := 1; c <= n; c++ {
				wantHist[c]++
			}
		}
		if fmt.Sprint(hist) != fmt.Sprint(wantHist) {
			t.Fatalf("%s: count histogram differs from the model (keys corrupted?)", format)
		}
	}
}
