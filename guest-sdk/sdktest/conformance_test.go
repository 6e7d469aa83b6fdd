package sdktest

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
)

// The conformance modules (guest-sdk/testdata/conformance) implement the same commands with
// each SDK. One script, one expected output, both languages.
var conformanceModules = []string{
	"../testdata/conformance/conformance-go.wasm",
	"../testdata/conformance/conformance-as.wasm",
}

type step struct {
	key, cmd string
	advance  int64 // when cmd is empty: move the watermark here and fire timers
	want     []string
	check    func(got []string) error // instead of want, for output that is not fixed
}

var bigBody = strings.Repeat("x", 5000)

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
}

func TestConformance(t *testing.T) {
	for _, path := range conformanceModules {
		t.Run(strings.TrimSuffix(path[strings.LastIndexByte(path, '/')+1:], ".wasm"), func(t *testing.T) {
			if strings.HasSuffix(path, "-go.wasm") && testing.Short() {
				t.Skip("-short: skipping the Go module")
			}
			in := load(t, path)
			if m := in.manifest; m.Name != "conformance" || strings.Join(m.States, ",") != "kv,map,big" || strings.Join(m.Endpoints, ",") != "echo" {
				t.Fatalf("manifest %+v", m)
			}
			if !slices.Contains(in.h.logs, logLine{1, "open: put NOT_ALLOWED"}) {
				t.Errorf("clink_open: state put was not refused with NOT_ALLOWED: logs %v", in.h.logs)
			}
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
// records through the counter logic (state read and write, JSON output, emit) leave the Go
// runtime's malloc count where it was.
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
	for range 10 { // warm up: buffers reach their final size
		in.process("k", "hot", 0)
	}
	before := mallocs()
	for range 10_000 {
		if _, err := in.process("k", "hot", 0); err != nil {
			t.Fatal(err)
		}
	}
	if after := mallocs(); after != before {
		t.Errorf("hot path allocated: %s before, %s after 10,000 records", before, after)
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
			} {
				in := load(t, path)
				_, err := in.process("k", tc.cmd, 0)
				if msg := guestMessage(err); !strings.HasPrefix(msg, tc.msg) {
					t.Errorf("%s: got %v, want a fault with message %q", tc.cmd, err, tc.msg)
				}
			}
		})
	}
}
