package sdktest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
)

// The conformance modules (guest-sdk/testdata/conformance) implement the same commands with
// each SDK. One script, one expected output, every language.
var conformanceModules = []string{
	"../testdata/conformance/conformance-go.wasm",
	"../testdata/conformance/conformance-as.wasm",
	"../testdata/conformance/conformance-c.wasm",
	"../testdata/conformance/conformance-rust.wasm",
}

type step struct {
	key, cmd string
	advance  int64 // when cmd is empty: move the watermark here and fire timers
	want     []string
	check    func(got []string) error // instead of want, for output that is not fixed
	// stored, when set, is what the host must hold for state "pf", entry "", after the step
	// ("absent" for no entry, "empty" for an empty value): what the frame write-back applied.
	stored string
}

var bigBody = strings.Repeat("x", 5000)

// Values for the prefetch steps: the host reserves a frame of at least 64 bytes, and 1.5x the
// value's size, so values of these sizes are certainly larger than any frame the previous
// step's value got.
var (
	huge  = strings.Repeat("h", 100_000)
	huge2 = strings.Repeat("i", 300_000)
	f64   = strings.Repeat("f", 64)
)

func get(v string) string { return `{"get":` + strconv.Quote(v) + `}` }

// padded is what the conformance modules' padded(i, size) builds: a JSON string of size bytes.
func padded(i, size int) string {
	s := `"` + strconv.Itoa(i)
	return s + strings.Repeat(" ", max(0, size-1-len(s))) + `"`
}

func paddedSeq(n, size int) []string {
	var out []string
	for i := range n {
		out = append(out, padded(i, size))
	}
	return out
}

// checkTime accepts {"time":T} with T the wall-clock time in ms: the production host serves
// processing_time from its clock.
func checkTime(got []string) error {
	now := time.Now().UnixMilli()
	var v struct{ Time int64 }
	if len(got) != 1 || json.Unmarshal([]byte(got[0]), &v) != nil || v.Time < now-60_000 || v.Time > now+1000 {
		return fmt.Errorf("want {\"time\":~%d}", now)
	}
	return nil
}

var script = []step{
	{key: "a", cmd: "count", want: []string{`{"count":1}`}},
	{key: "a", cmd: "count", want: []string{`{"count":2}`}},
	{key: "b", cmd: "count", want: []string{`{"count":1}`}},
	{key: "a", cmd: "put x=1"},
	{key: "a", cmd: "get x", want: []string{`{"get":"1"}`}},
	{key: "b", cmd: "get x", want: []string{`{"get":null}`}}, // state is scoped to the record key
	{key: "a", cmd: `put y=ü"q`},
	{key: "a", cmd: "get y", want: []string{`{"get":"ü\"q"}`}},
	{key: "a", cmd: "put z=abc日本🎉def"},
	{key: "a", cmd: "get z", want: []string{`{"get":"abc日本🎉def"}`}},
	{key: "a", cmd: "del x"},
	{key: "a", cmd: "get x", want: []string{`{"get":null}`}},
	{key: "a", cmd: "del never-there"},
	{key: "a", cmd: "put empty="},
	{key: "a", cmd: "get empty", want: []string{`{"get":""}`}}, // an empty value is a value
	{key: "a", cmd: "has", want: []string{`{"has":false}`}},
	{key: "a", cmd: "big 10", want: []string{`{"big":10}`}},
	{key: "a", cmd: "big 100000", want: []string{`{"big":100000}`}}, // beyond the result buffer: take_result
	{key: "a", cmd: "big 0", want: []string{`{"big":0}`}},
	{key: "a", cmd: "has", want: []string{`{"has":true}`}},
	{key: "a", cmd: "timer 100"},
	{key: "b", cmd: "timer 50"},
	{key: "b", cmd: "timer 50"},
	{key: "a", cmd: "timer 200"},
	{key: "a", cmd: "deltimer 200"},
	{advance: 150, want: []string{`{"timer":50,"key":"b"}`, `{"timer":100,"key":"a"}`}},
	{key: "a", cmd: "watermark", want: []string{`{"watermark":150}`}},
	{key: "a", cmd: "time", check: checkTime},
	{key: "a", cmd: "lookup /v1/geo?ip=1.2.3.4", want: []string{`{"status":200,"body":"GET /v1/geo?ip=1.2.3.4\nX-Test: 1\n"}`}},
	{key: "a", cmd: "lookup /status/404", want: []string{`{"status":404,"body":""}`}},
	{key: "a", cmd: "lookup /slow", want: []string{`{"error":"LOOKUP_TIMEOUT","retryable":true}`}},
	{key: "a", cmd: "post hello", want: []string{`{"status":200,"body":"POST /echo\n\nhello"}`}},
	{key: "a", cmd: "post " + bigBody, want: []string{`{"status":200,"body":"POST /echo\n\n` + bigBody + `"}`}},
	{key: "a", cmd: "inject", want: []string{`{"error":"LOOKUP_REFUSED","retryable":false}`}},
	{key: "a", cmd: `json {"a":[1,{"v":0}],"v":-42}`, want: []string{`{"field":-42,"int":-42}`}},
	{key: "a", cmd: `json {"v":1.5}`, want: []string{`{"field":1.5,"int":null}`}},
	{key: "a", cmd: `json {"v":"s"}`, want: []string{`{"field":"s","int":null}`}},
	{key: "a", cmd: `json { "v" : { "v" : 2 } }`, want: []string{`{"field":{ "v" : 2 },"int":null}`}},
	{key: "a", cmd: `json {"x":1}`, want: []string{`{"field":null}`}},
	{key: "a", cmd: `json {"v":-9223372036854775808}`, want: []string{`{"field":-9223372036854775808,"int":-9223372036854775808}`}},
	{key: "a", cmd: `json {"v":9223372036854775808}`, want: []string{`{"field":9223372036854775808,"int":null}`}},
	{key: "a", cmd: `unquote {"v":"q\"b\\s\/ \b\f\n\r\t \u00e9\u65E5 \ud83c\udf89 \ud83c \udf89x"}`, want: []string{`{"unquoted":"q\"b\\s/ \b\f\n\r\t é日 🎉 ` + "\uFFFD \uFFFD" + `x"}`}},
	{key: "a", cmd: `unquote {"v":"bad \x"}`, want: []string{`{"unquoted":false}`}},
	{key: "a", cmd: `unquote {"v":12}`, want: []string{`{"unquoted":false}`}},
	{key: "k\x01\"é\n\t\\", cmd: "key", want: []string{`{"key":"k\u0001\"é\n\t\\"}`}},
	{key: "", cmd: "key", want: []string{`{"key":""}`}},
	{key: "a", cmd: "bigemit 70000", want: []string{`"` + strings.Repeat("y", 70000) + `"`}},
	{key: "a", cmd: "log hi"},
	{key: "a", cmd: "order -17"},
	{key: "ü", cmd: "hot", want: []string{`{"key":"ü","hot":1}`}},
	{key: "ü", cmd: "hot", want: []string{`{"key":"ü","hot":2}`}},

	// Prefetched values (docs/abi.md, "Prefetched values"): pf and pf2 are prefetched.
	{key: "p", cmd: "pget", want: []string{`{"get":null}`}, stored: "absent"},
	{key: "p", cmd: "phas", want: []string{`{"has":false}`}},
	{key: "p", cmd: "pcount", want: []string{`{"pf":1,"pf2":10}`}},
	{key: "p", cmd: "pcount", want: []string{`{"pf":2,"pf2":20}`}},
	{key: "q", cmd: "pcount", want: []string{`{"pf":1,"pf2":10}`}}, // frames are per key
	{key: "p", cmd: "phas", want: []string{`{"has":true}`}},
	{key: "p", cmd: "pputs v1", want: []string{get("v1")}, stored: "v1"}, // write-back
	{key: "p", cmd: "pget", want: []string{get("v1")}},
	{key: "p", cmd: "pputs " + f64, want: []string{get(f64)}, stored: f64},
	// Larger than the frame: through put, read back in the same call.
	{key: "p", cmd: "pputs " + huge, want: []string{get(huge)}, stored: huge},
	{key: "p", cmd: "pget", want: []string{get(huge)}}, // delivered whole in the next frame
	// Small, large, small in one call: every read sees the write before it, the last wins.
	{key: "p", cmd: "pputs s1 " + huge2 + " s2", want: []string{get("s1"), get(huge2), get("s2")}, stored: "s2"},
	{key: "p", cmd: "pputs " + huge + " " + huge2, want: []string{get(huge), get(huge2)}, stored: huge2},
	{key: "p", cmd: "pputs s3", want: []string{get("s3")}, stored: "s3"},
	{key: "p", cmd: "pputs s4 " + huge, want: []string{get("s4"), get(huge)}, stored: huge},
	{key: "p", cmd: "pdel", want: []string{`{"get":null}`}, stored: "absent"},
	{key: "p", cmd: "pputs " + huge + " x", want: []string{get(huge), get("x")}, stored: "x"},
	{key: "p", cmd: "pputdel " + huge2, want: []string{`{"get":null}`}, stored: "absent"},
	{key: "p", cmd: "pputdel y", want: []string{`{"get":null}`}, stored: "absent"},
	{key: "p", cmd: "pputs ", want: []string{get("")}, stored: "empty"}, // an empty value is a value
	{key: "p", cmd: "phas", want: []string{`{"has":true}`}},
	{key: "p", cmd: "pentry 7", want: []string{`{"entry":"7"}`}, stored: "empty"},
	{key: "p", cmd: "pget", want: []string{get("")}},
	// A timer gets frames: onTimer reads pf2 and writes pf2+timestamp back.
	{key: "t", cmd: "pcount", want: []string{`{"pf":1,"pf2":10}`}},
	{key: "t", cmd: "timer 300"},
	{advance: 400, want: []string{`{"timer":300,"key":"t","pf2":10}`}},
	{key: "t", cmd: "pcount", want: []string{`{"pf":2,"pf2":320}`}},

	// The output area (docs/abi.md, "The output area"): 1,000 records of 200 bytes overflow it
	// (64 KiB in Go, 4 KiB in AssemblyScript), records larger than it go through the emit
	// import, and the order holds throughout.
	{key: "e", cmd: "emitmany 1000 200", want: paddedSeq(1000, 200)},
	{key: "e", cmd: "emitmany 3 70000", want: paddedSeq(3, 70000)},
	{key: "e", cmd: "emitmix", want: []string{padded(0, 4), padded(1, 70000), padded(2, 4), padded(3, 5000), padded(4, 4)}},
	{key: "e", cmd: "emitmany 0 1"},
}

func TestConformance(t *testing.T) {
	for _, path := range conformanceModules {
		t.Run(strings.TrimSuffix(path[strings.LastIndexByte(path, '/')+1:], ".wasm"), func(t *testing.T) {
			if strings.HasSuffix(path, "-go.wasm") && testing.Short() {
				t.Skip("-short: skipping the Go module")
			}
			in := load(t, path)
			if m := in.manifest; m.Name != "conformance" || strings.Join(m.States, ",") != "kv,map,big,pf,pf2" ||
				strings.Join(m.Prefetch, ",") != "pf,pf2" || strings.Join(m.Endpoints, ",") != "echo" {
				t.Fatalf("manifest %+v", m)
			}
			for _, l := range []string{"open: put NOT_ALLOWED", "open: emit NOT_ALLOWED", "open: prefetched put NOT_ALLOWED"} {
				if !slices.Contains(in.h.logs, logLine{1, l}) {
					t.Errorf("clink_open: want log %q, got %v", l, in.h.logs)
				}
			}
			pfIndex := uint32(slices.Index(in.manifest.States, "pf"))
			for i, s := range script {
				var out []output
				var err error
				if s.cmd == "" {
					out, err = in.advance(s.advance)
				} else {
					out, err = in.process(s.key, s.cmd, 7)
				}
				if err != nil {
					t.Fatalf("step %d (%q): %v", i, s.cmd, err)
				}
				var got []string
				for _, o := range out {
					got = append(got, o.value)
					if s.cmd != "" && o.key != s.key {
						t.Errorf("step %d: emitted key %q, want the record key %q", i, o.key, s.key)
					}
				}
				if s.check != nil {
					if err := s.check(got); err != nil {
						t.Errorf("step %d (%.40q): got %.200q: %v", i, s.cmd, got, err)
					}
				} else if !slices.Equal(got, s.want) {
					t.Errorf("step %d (%.40q): got %.200q, want %.200q", i, s.cmd, got, s.want)
				}
				if s.stored != "" {
					v, ok := in.h.stored(s.key, pfIndex, "")
					switch {
					case !ok:
						v = "absent"
					case v == "":
						v = "empty"
					}
					if v != s.stored {
						t.Errorf("step %d (%.40q): host holds %.40q, want %.40q", i, s.cmd, v, s.stored)
					}
				}
			}
			if in.h.order != -17 {
				t.Errorf("set_resume_order: host saw %d, want -17", in.h.order)
			}
			tail := in.h.logs[len(in.h.logs)-4:]
			if !slices.Equal(tail, []logLine{{0, "debug hi"}, {1, "info hi"}, {2, "warn hi"}, {3, "error hi"}}) {
				t.Errorf("log: got %v", tail)
			}
			out, err := in.close()
			if err != nil || len(out) != 1 || out[0].value != `{"closed":true}` {
				t.Errorf("close: %v, %v", out, err)
			}
		})
	}
}

// TestKeyFunction calls clink_key directly: both modules key by the "user" field.
func TestKeyFunction(t *testing.T) {
	for _, path := range conformanceModules {
		t.Run(strings.TrimSuffix(path[strings.LastIndexByte(path, '/')+1:], ".wasm"), func(t *testing.T) {
			if strings.HasSuffix(path, "-go.wasm") && testing.Short() {
				t.Skip("-short: skipping the Go module")
			}
			in := load(t, path)
			for _, tc := range []struct {
				value, key string
				ok         bool
			}{
				{`{"user":"alice","n":1}`, "alice", true},
				{`{"n":1, "user" : "a\"b\u00e9"}`, `a"bé`, true},
				{`{"user":42}`, "42", true},
				{`{"user":""}`, "", true},
				{`{"name":"x"}`, "", false},
				{`not json`, "", false},
			} {
				key, err := in.in.Key([]byte(tc.value))
				if errors.Is(err, abi.ErrKeyRejected) {
					if tc.ok {
						t.Errorf("clink_key(%s) rejected the record", tc.value)
					}
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if !tc.ok || string(key) != tc.key {
					t.Errorf("clink_key(%s) = %q, want %q (ok %v)", tc.value, key, tc.key, tc.ok)
				}
			}
		})
	}
}

// TestGoHotPathAllocations checks that the Go SDK's hot path allocates nothing: 10,000
// records through the counter logic (state read and write, JSON output, emit), through the
// imports (hot) and through a prefetch frame (phot), leave the Go runtime's malloc count where
// it was.
func TestGoHotPathAllocations(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the Go module")
	}
	in := load(t, conformanceModules[0])
	mallocs := func() string {
		out, err := in.process("k", "mallocs", 0)
		if err != nil || len(out) != 1 {
			t.Fatal(out, err)
		}
		return out[0].value
	}
	for _, cmd := range []string{"hot", "phot"} {
		for range 10 { // warm up: buffers reach their final size, the output area exists
			in.process("k", cmd, 0)
		}
		before := mallocs()
		for range 10_000 {
			if _, err := in.process("k", cmd, 0); err != nil {
				t.Fatal(err)
			}
		}
		if after := mallocs(); after != before {
			t.Errorf("%s: hot path allocated: %s before, %s after 10,000 records", cmd, before, after)
		}
	}
}

// TestConformanceFault checks that a failing record surfaces as the ABI says: a non-zero
// return (Go) or a trap (AssemblyScript), with the guest's message as the last error-level
// log line of the call.
func TestConformanceFault(t *testing.T) {
	for _, path := range conformanceModules {
		t.Run(strings.TrimSuffix(path[strings.LastIndexByte(path, '/')+1:], ".wasm"), func(t *testing.T) {
			if strings.HasSuffix(path, "-go.wasm") && testing.Short() {
				t.Skip("-short: skipping the Go module")
			}
			for _, tc := range []struct{ cmd, msg string }{
				{"fail boom", "failed on purpose: boom"},
				{"nonsense", `unknown command "nonsense"`},
				// A failed call's frame writes and area records are discarded.
				{"pfail lost", "failed on purpose after a write"},
			} {
				in := load(t, path)
				out, err := in.process("k", tc.cmd, 0)
				if msg := guestMessage(err); !strings.HasPrefix(msg, tc.msg) {
					t.Errorf("%s: got %v, want a fault with message %q", tc.cmd, err, tc.msg)
				}
				if len(out) != 0 {
					t.Errorf("%s: a failed call delivered %q", tc.cmd, out)
				}
				if len(in.h.state) != 0 {
					t.Errorf("%s: a failed call changed the state: %q", tc.cmd, in.h.state)
				}
			}
			// GetInt64 of a prefetched value that is not 8 bytes fails the record.
			in := load(t, path)
			if _, err := in.process("k", "pputs v1", 0); err != nil {
				t.Fatal(err)
			}
			if _, err := in.process("k", "pint", 0); err == nil {
				t.Errorf("pint of a 2-byte value: no fault")
			}
		})
	}
}

// TestPrefetchTooLarge: a prefetched value over the host's frame limit arrives as the too-large
// marker; both SDKs then read it (and write it) through the imports.
func TestPrefetchTooLarge(t *testing.T) {
	ctx := context.Background()
	e, err := abi.NewEngine(ctx, abi.WithLimits(abi.Limits{MaxPrefetchValue: 16}))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	for _, path := range conformanceModules {
		t.Run(strings.TrimSuffix(path[strings.LastIndexByte(path, '/')+1:], ".wasm"), func(t *testing.T) {
			if strings.HasSuffix(path, "-go.wasm") && testing.Short() {
				t.Skip("-short: skipping the Go module")
			}
			bin, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			m, err := e.Load(ctx, bin, abi.WithEndpoints("echo"))
			if err != nil {
				t.Fatal(err)
			}
			h := newHandler(t)
			ai, err := m.Instantiate(ctx, h)
			if err != nil {
				t.Fatal(err)
			}
			defer ai.Close(ctx)
			in := &instance{t: t, h: h, in: ai, manifest: m.Manifest}
			big := strings.Repeat("x", 40) // over the 16-byte frame limit, under the frame's cap
			if _, err := in.process("k", "pputs "+big, 1); err != nil {
				t.Fatal(err)
			}
			out, err := in.process("k", "pget", 2)
			if err != nil {
				t.Fatal(err)
			}
			if len(out) != 1 || !strings.Contains(out[0].value, big) {
				t.Fatalf("pget of a too-large value: %q", out)
			}
		})
	}
}
