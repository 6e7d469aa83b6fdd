package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/lookup"
)

// flakyUpstream is the endpoint of host/abi's "flaky" module. A request body is the record's
// value, {"k":K,"i":I,"fail":F}: the first F requests that present the record's
// Idempotency-Key are answered "t" (the module traps, changing nothing), the later ones
// {"k":K,"i":I,"count": (the module counts the record and emits that, completed by its count).
// Keying the attempts by the Idempotency-Key also checks that a retry presents the key of the
// first attempt: with a fresh key every attempt would look like a first one and trap.
type flakyUpstream struct {
	srv *httptest.Server
	mu  sync.Mutex
	// attempts counts the requests per Idempotency-Key; record maps a key to its record's I.
	attempts map[string]int
	record   map[string]int
}

// fixturePath is the absolute path of host/abi's testdata module name.
func fixturePath(t *testing.T, name string) string {
	p, err := filepath.Abs(filepath.Join("..", "abi", "testdata", name+".wasm"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newFlakyUpstream(t *testing.T) *flakyUpstream {
	u := &flakyUpstream{attempts: map[string]int{}, record: map[string]int{}}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var v struct {
			K    string
			I    int
			Fail int
		}
		k := r.Header.Get("Idempotency-Key")
		if err := json.Unmarshal(body, &v); err != nil || k == "" || r.Method != "POST" || r.URL.Path != "/api/check" {
			http.Error(w, "bad request", 400) // the module fails the call with code 2: not what the test expects
			return
		}
		u.mu.Lock()
		u.attempts[k]++
		n := u.attempts[k]
		if i, ok := u.record[k]; ok && i != v.I {
			u.record[k] = -1 // two records presented one key
		} else {
			u.record[k] = v.I
		}
		u.mu.Unlock()
		if n <= v.Fail {
			io.WriteString(w, "t")
			return
		}
		fmt.Fprintf(w, `{"k":%q,"i":%d,"count":`, v.K, v.I)
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *flakyUpstream) endpoint(t *testing.T) lookup.EndpointConfig {
	ep, err := ParseEndpointFlag("svc=" + u.srv.URL + "/api")
	if err != nil {
		t.Fatal(err)
	}
	ep.Methods = []string{"POST"}
	return ep
}

// check compares what the upstream saw with the model: one Idempotency-Key per record, and
// per record min(fail, retries) + 1 requests.
func (u *flakyUpstream) check(t *testing.T, fails []int, retries int) {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.attempts) != len(fails) {
		t.Fatalf("%d distinct idempotency keys, want one per record (%d)", len(u.attempts), len(fails))
	}
	for k, n := range u.attempts {
		i := u.record[k]
		if i < 0 || i >= len(fails) {
			t.Fatalf("key %s: record %d", k, i)
		}
		if want := min(fails[i], retries) + 1; n != want {
			t.Fatalf("record %d (fails %d times, %d retries) was attempted %d times, want %d", i, fails[i], retries, n, want)
		}
	}
}

// flakyRecords is the input of the retry tests: n records over keys k0..k4, record i failing
// fails[i] times (0 for most; 1, 2, or always for some).
func flakyRecords(n int) ([]string, []int) {
	vals, fails := make([]string, n), make([]int, n)
	for i := range n {
		switch {
		case i%13 == 6:
			fails[i] = 1000 // always: dead-lettered after the retries
		case i%7 == 3:
			fails[i] = 1
		case i%11 == 5:
			fails[i] = 2
		}
		vals[i] = fmt.Sprintf(`{"k":"k%d","i":%d,"fail":%d}`, i%5, i, fails[i])
	}
	return vals, fails
}

// flakyModel is what an exactly-once run with retries emits per key: the records that succeed
// within retries+1 attempts, in input order, each with the count of its key so far.
func flakyModel(vals []string, fails []int, retries int) (map[string][]string, map[int]bool) {
	want, dead := map[string][]string{}, map[int]bool{}
	for i := range vals {
		if fails[i] > retries {
			dead[i] = true
			continue
		}
		k := fmt.Sprintf("k%d", i%5)
		want[k] = append(want[k], fmt.Sprintf(`{"k":%q,"i":%d,"count":%d}`, k, i, len(want[k])+1))
	}
	return want, dead
}

// checkFlakyDeadLetters checks the dead letters against the model: exactly the records that
// fail more often than the retries allow, each once, with its operator, key, raw value, the
// attempts made and a reason naming the operator, the record and the guest's error log.
func checkFlakyDeadLetters(t *testing.T, lines [][]byte, vals []string, dead map[int]bool, retries int, where func(i int) string) {
	t.Helper()
	seen := map[int]bool{}
	for _, l := range lines {
		var d struct {
			Operator, Key, Reason, Raw string
			Attempts                   int
		}
		if err := json.Unmarshal(l, &d); err != nil {
			t.Fatalf("dead letter %s: %v", l, err)
		}
		var v struct{ I int }
		if err := json.Unmarshal([]byte(d.Raw), &v); err != nil || !dead[v.I] || seen[v.I] || d.Raw != vals[v.I] {
			t.Fatalf("dead letter %s: not one of the records that always fail, or twice", l)
		}
		seen[v.I] = true
		if d.Operator != "flaky" || d.Key != fmt.Sprintf("k%d", v.I%5) || d.Attempts != retries+1 ||
			!strings.Contains(d.Reason, `operator "flaky" failed at `+where(v.I)) || !strings.Contains(d.Reason, "told to trap") {
			t.Fatalf("dead letter %s", l)
		}
	}
	if len(seen) != len(dead) {
		t.Fatalf("%d dead letters, want %d", len(seen), len(dead))
	}
}

// TestRetryThenSucceeds: a record whose call traps without effect on its first attempts and
// then succeeds is run again (retries) and counted exactly once: the output holds, per key,
// exactly the model's lines (no duplicate from a failed attempt, no gap), the records that fail
// more often than the retries allow are dead-lettered once each, and the metrics count the
// retries and the dead letters. Spec form, at parallelism 2, with several records in flight.
// With retries 0 every record that fails at all is dead-lettered, so the retries are what
// save the others.
func TestRetryThenSucceeds(t *testing.T) {
	mod := fixturePath(t, "flaky")
	vals, fails := flakyRecords(400)
	for _, retries := range []int{2, 0} {
		t.Run(fmt.Sprintf("retries=%d", retries), func(t *testing.T) {
			up := newFlakyUpstream(t)
			var recs []SourceRecord
			for i, v := range vals {
				recs = append(recs, SourceRecord{Key: []byte(fmt.Sprintf("k%d", i%5)), Value: []byte(v), Pos: int64(i)})
			}
			out, dead := &memSink{}, &memSink{}
			conns := &Connectors{}
			conns.RegisterSource("mem", func(*SourceSpec, *ConnectorOptions, *Env) (Source, error) { return &memSource{recs: recs}, nil })
			conns.RegisterSink("out", func(*SinkSpec, *ConnectorOptions, *Env) (Sink, error) { return out, nil })
			conns.RegisterSink("dead", func(*SinkSpec, *ConnectorOptions, *Env) (Sink, error) { return dead, nil })
			spec, err := ParseSpec([]byte(fmt.Sprintf(`
name: retry
sources: [{name: in, type: mem}]
operators:
  - name: flaky
    module: %s
    inputs: [in]
    key: {source: true}
    parallelism: 2
    on_error: dead-letter
    retries: %d
    limits: {max_in_flight: 8}
    endpoints: [{name: svc, base_url: %q, methods: [POST], egress: {allow_loopback: true}}]
sinks:
  - {name: out, type: out, inputs: [flaky]}
  - {name: dead, type: dead, inputs: [flaky.errors]}
`, mod, retries, up.srv.URL+"/api")))
			if err != nil {
				t.Fatal(err)
			}
			j, err := Start(context.Background(), spec, Env{Connectors: conns, StateURL: newMemPool(t)})
			if err != nil {
				t.Fatal(err)
			}
			m, err := j.Wait()
			if err != nil {
				t.Fatal(err)
			}
			want, deadModel := flakyModel(vals, fails, retries)
			got := map[string][]string{}
			for _, r := range out.recs {
				got[string(r.Key)] = append(got[string(r.Key)], string(r.Value))
			}
			for k, w := range want {
				if !slices.Equal(got[k], w) {
					t.Fatalf("key %s: output\n%q\nwant\n%q", k, got[k], w)
				}
			}
			if len(got) != len(want) {
				t.Fatalf("output keys %d, want %d", len(got), len(want))
			}
			var lines [][]byte
			for _, r := range dead.recs {
				lines = append(lines, r.Value)
			}
			checkFlakyDeadLetters(t, lines, vals, deadModel, retries, func(i int) string { return "the record at source position " + strconv.Itoa(i) })
			up.check(t, fails, retries)
			var retried, dl, in int64
			for _, o := range m.Operators {
				retried += o.Retries
				dl += o.DeadLetters
				in += o.RecordsIn
			}
			var wantRetries int64
			for _, f := range fails {
				wantRetries += int64(min(f, retries))
			}
			if retried != wantRetries || dl != int64(len(deadModel)) || in != int64(len(vals)) {
				t.Fatalf("metrics: %d retries, %d dead letters, %d records in; want %d, %d, %d", retried, dl, in, wantRetries, len(deadModel), len(vals))
			}
		})
	}
}

// TestFlagFormRetryThenSucceeds is TestRetryThenSucceeds in the flag form (Options.Retries,
// OnError dead-letter), with a durable pool and checkpoints during the run: the output holds
// each key's model lines in order, and the summary counts the retries and the dead letters.
func TestFlagFormRetryThenSucceeds(t *testing.T) {
	vals, fails := flakyRecords(300)
	const retries = 2
	up := newFlakyUpstream(t)
	var dl strings.Builder
	out, sum, err := runOpts(t, Options{Module: abiFixture(t, "flaky"), KeyField: "k", OnError: "dead-letter", Retries: retries,
		DeadLetter: &dl, Endpoints: []lookup.EndpointConfig{up.endpoint(t)}, MaxInFlight: 8, StateURL: newMemPool(t), CheckpointEvery: 1,
		InputName: "in"}, strings.Join(vals, "\n")+"\n")
	if err != nil {
		t.Fatal(err)
	}
	want, deadModel := flakyModel(vals, fails, retries)
	got := map[string][]string{}
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var v struct{ K string }
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("output %q: %v", l, err)
		}
		got[v.K] = append(got[v.K], l)
	}
	for k, w := range want {
		if !slices.Equal(got[k], w) {
			t.Fatalf("key %s: output\n%q\nwant\n%q", k, got[k], w)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("output keys %d, want %d", len(got), len(want))
	}
	var lines [][]byte
	for _, l := range strings.Split(strings.TrimSuffix(dl.String(), "\n"), "\n") {
		lines = append(lines, []byte(l))
	}
	checkFlakyDeadLetters(t, lines, vals, deadModel, retries, func(i int) string { return "input line " + strconv.Itoa(i+1) })
	up.check(t, fails, retries)
	var wantRetries int64
	for _, f := range fails {
		wantRetries += int64(min(f, retries))
	}
	if sum.Scheduler.RecordRetries != wantRetries || sum.DeadLetters != int64(len(deadModel)) || sum.RecordsIn != int64(len(vals)) ||
		sum.RecordsOut != int64(len(vals)-len(deadModel)) || len(sum.Checkpoints) == 0 {
		t.Fatalf("summary: %d retries, %d dead letters, %d in, %d out, checkpoints %v; want %d, %d, %d, %d", sum.Scheduler.RecordRetries,
			sum.DeadLetters, sum.RecordsIn, sum.RecordsOut, sum.Checkpoints, wantRetries, len(deadModel), len(vals), len(vals)-len(deadModel))
	}
}
