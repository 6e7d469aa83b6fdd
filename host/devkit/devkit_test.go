package devkit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
)

func sdkDirForTest(t *testing.T) string {
	t.Helper()
	sdk, err := FindSDK("../../guest-sdk")
	if err != nil {
		t.Fatal(err)
	}
	return sdk
}

// TestNewBuildTest scaffolds a project in each language from an empty directory, builds it and
// runs its test table: the scaffold must pass at once. Then it breaks one expectation and
// checks that the table fails with a diff naming it. A language whose toolchain is not
// installed is skipped (CI installs all four).
func TestNewBuildTest(t *testing.T) {
	sdk := sdkDirForTest(t)
	ctx := context.Background()
	for _, lang := range Languages {
		t.Run(lang, func(t *testing.T) {
			if lang == "go" && testing.Short() {
				t.Skip("-short: skipping the Go build")
			}
			dir := filepath.Join(t.TempDir(), "my-op")
			if _, err := Scaffold(dir, lang, "my-op", sdk); err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{ProjectFile, "manifest.json", "tests.json", "README.md", "input.jsonl", Source(lang)} {
				if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
					t.Errorf("scaffold lacks %s: %v", f, err)
				}
			}
			readme, _ := os.ReadFile(filepath.Join(dir, "README.md"))
			for _, c := range []string{"clink-wasm build", "clink-wasm test", "clink-wasm run --module my-op.wasm"} {
				if !bytes.Contains(readme, []byte(c)) {
					t.Errorf("README lacks %q", c)
				}
			}
			res, err := Build(ctx, dir)
			if errors.Is(err, ErrToolchain) {
				t.Skip(err)
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Report.ManifestSource != "custom section clink.manifest" || res.Report.Manifest.Name != "my-op" {
				t.Errorf("built module: manifest %+v from %q", res.Report.Manifest, res.Report.ManifestSource)
			}
			var out bytes.Buffer
			results, err := Test(ctx, dir, &out)
			if err != nil || len(results) != 2 {
				t.Fatalf("scaffold's tests: %v\n%s", err, out.String())
			}

			// A wrong expectation: the output and the state differ, and the diff says where.
			tests := filepath.Join(dir, "tests.json")
			b, _ := os.ReadFile(tests)
			b = bytes.Replace(b, []byte(`{"key": "alice", "count": 2}`), []byte(`{"key": "alice", "count": 3}`), 1)
			b = bytes.Replace(b, []byte(`"bob": {"count": {"": {"i64": 1}}}`), []byte(`"bob": {"count": {"": {"i64": 7}}}`), 1)
			if err := os.WriteFile(tests, b, 0o644); err != nil {
				t.Fatal(err)
			}
			out.Reset()
			if _, err := Test(ctx, dir, &out); !errors.Is(err, ErrFailed) {
				t.Fatalf("a broken expectation passed: %v\n%s", err, out.String())
			}
			for _, want := range []string{
				"FAIL  counts per key",
				`output 3: - {"key":"alice","count":3}`,
				`output 3: + {"key":"alice","count":2}`,
				`state count[""] of key "bob": {"i64": 1}, want {"i64": 7}`,
				"ok    continues from the stored count",
				"1 of 2 cases passed",
			} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("report lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}

// TestBuildManifestDrift: a manifest.json that disagrees with what the source declares is
// refused, and no module is written.
func TestBuildManifestDrift(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "drift")
	if _, err := Scaffold(dir, "c", "drift", sdkDirForTest(t)); err != nil {
		t.Fatal(err)
	}
	m := `{"abi":1,"name":"drift","states":["other"],"prefetch":["other"],"endpoints":[]}`
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), []byte(m), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Build(context.Background(), dir)
	if errors.Is(err, ErrToolchain) {
		t.Skip(err)
	}
	if err == nil || !strings.Contains(err.Error(), "make them agree") {
		t.Fatalf("Build = %v, want a manifest mismatch", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "drift.wasm")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a module was written despite the mismatch: %v", err)
	}
}

func TestScaffoldRefuses(t *testing.T) {
	sdk := sdkDirForTest(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Scaffold(dir, "c", "op", sdk); err == nil {
		t.Error("scaffolded into a non-empty directory")
	}
	if _, err := Scaffold(filepath.Join(dir, "a"), "cobol", "op", sdk); err == nil {
		t.Error("scaffolded an unknown language")
	}
	if _, err := Scaffold(filepath.Join(dir, "b"), "c", "bad name", sdk); err == nil {
		t.Error("scaffolded an invalid name")
	}
	if _, err := LoadProject(dir); !errors.Is(err, ErrNotProject) {
		t.Errorf("LoadProject of a plain directory: %v", err)
	}
}

// TestRunTable runs a table with every kind of step against the C conformance module (commands
// as record values): initial state, scripted lookups and lookup failures, watermarks firing
// timers, expected state, and an expected fault.
func TestRunTable(t *testing.T) {
	bin, err := os.ReadFile("../../guest-sdk/testdata/conformance/conformance-c.wasm")
	if err != nil {
		t.Fatal(err)
	}
	const table = `{"cases": [
	  {"name": "state and timers",
	   "state": {"a": {"kv": {"": {"i64": 41}}, "map": {"x": "old"}}},
	   "input": [
	     {"key": "a", "value": "count"},
	     {"key": "a", "value": "get x"},
	     {"key": "a", "value": "put y=new"},
	     {"key": "a", "value": "del x"},
	     {"key": "a", "value": "timer 100"},
	     {"key": "b", "value": "timer 50"},
	     {"watermark": 150},
	     {"key": "a", "value": "watermark"}
	   ],
	   "expect": {
	     "outputs": [{"count": 42}, {"get": "old"}, {"timer": 50, "key": "b"}, {"timer": 100, "key": "a"}, {"watermark": 150}, "{\"closed\":true}"],
	     "state": {"a": {"kv": {"": {"i64": 42}}, "map": {"x": null, "y": "new"}}}
	   }},
	  {"name": "lookups",
	   "lookups": [
	     {"request": "GET /geo?ip=1", "status": 200, "body": "{\"c\":\"fr\"}"},
	     {"request": "GET /down", "error": "LOOKUP_UNAVAILABLE"},
	     {"endpoint": "echo", "request": "POST /echo", "status": 201}
	   ],
	   "input": [
	     {"key": "a", "value": "lookup /geo?ip=1"},
	     {"key": "a", "value": "lookup /down"},
	     {"key": "a", "value": "post hi"}
	   ],
	   "expect": {"outputs": [
	     {"status": 200, "body": "{\"c\":\"fr\"}"},
	     {"error": "LOOKUP_UNAVAILABLE", "retryable": true},
	     {"status": 201, "body": ""},
	     {"closed": true}
	   ]}},
	  {"name": "fault",
	   "input": [{"key": "a", "value": "count"}, {"key": "a", "value": "fail boom"}],
	   "expect": {"outputs": [{"count": 1}], "error": "failed on purpose: boom"}}
	]}`
	var tab Table
	if err := json.Unmarshal([]byte(table), &tab); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if _, err := RunTable(context.Background(), bin, "user", &tab, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}

	// Unscripted lookups, missing faults and unexpected faults all fail their case.
	const bad = `{"cases": [
	  {"name": "unscripted", "input": [{"key": "a", "value": "lookup /nowhere"}], "expect": {"outputs": []}},
	  {"name": "no fault", "input": [{"key": "a", "value": "count"}], "expect": {"outputs": [{"count": 1}], "error": "boom"}},
	  {"name": "unexpected fault", "input": [{"key": "a", "value": "fail boom"}], "expect": {"outputs": []}}
	]}`
	tab = Table{} // Unmarshal into the old value would keep the old cases' fields
	if err := json.Unmarshal([]byte(bad), &tab); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	res, err := RunTable(context.Background(), bin, "user", &tab, &out)
	if !errors.Is(err, ErrFailed) || len(res) != 3 {
		t.Fatalf("RunTable = %v\n%s", err, out.String())
	}
	for i, want := range []string{`no scripted response`, `error: none, want one containing "boom"`, `failed on purpose: boom`} {
		if !strings.Contains(strings.Join(res[i].Diff, "\n"), want) {
			t.Errorf("case %q: diff %q lacks %q", res[i].Name, res[i].Diff, want)
		}
	}
}

// TestMissingToolchain: a missing compiler is reported with the packages to install.
func TestMissingToolchain(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "op")
	if _, err := Scaffold(dir, "c", "op", sdkDirForTest(t)); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CLANG", filepath.Join(t.TempDir(), "no-such-clang"))
	_, err := Build(context.Background(), dir)
	if !errors.Is(err, ErrToolchain) || !strings.Contains(err.Error(), "apt-get install clang lld wasi-libc libclang-rt-14-dev-wasm32") {
		t.Fatalf("Build without clang = %v", err)
	}
}

// TestDocumentedCase: the example case in guest-sdk/README.md is a valid case.
func TestDocumentedCase(t *testing.T) {
	doc, err := os.ReadFile("../../guest-sdk/README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(doc)
	i := strings.Index(s, "A test table is")
	j := strings.Index(s[i:], "```json\n")
	k := strings.Index(s[i+j+8:], "```")
	if i < 0 || j < 0 || k < 0 {
		t.Fatal("guest-sdk/README.md has no example case")
	}
	dec := json.NewDecoder(strings.NewReader(s[i+j+8 : i+j+8+k]))
	dec.DisallowUnknownFields()
	var c Case
	if err := dec.Decode(&c); err != nil {
		t.Fatal(err)
	}
	if len(c.Input) != 3 || c.Input[1].Watermark == nil || len(c.Lookups) != 2 || c.Expect.State["alice"]["count"][""] == nil {
		t.Errorf("example case decoded as %+v", c)
	}
}

// TestLatencyReordersKeys: a scripted lookup latency holds key a's records back while key b's
// run, as the production controller does; each key's outputs stay in its input order. The
// latency runs on synctest's clock, so the test does not depend on the machine's speed. Two
// instances ran (a's call was suspended while b's ran), so clink_close ran twice.
func TestLatencyReordersKeys(t *testing.T) {
	bin, err := os.ReadFile("../../guest-sdk/testdata/conformance/conformance-c.wasm")
	if err != nil {
		t.Fatal(err)
	}
	const table = `{"cases": [
	  {"name": "slow a",
	   "lookups": [
	     {"request": "GET /slow", "status": 200, "body": "s", "latency_ms": 3600000},
	     {"request": "GET /fast", "status": 200, "body": "f"}
	   ],
	   "input": [
	     {"key": "a", "value": "lookup /slow"},
	     {"key": "a", "value": "count"},
	     {"key": "b", "value": "lookup /fast"},
	     {"key": "b", "value": "count"}
	   ],
	   "expect": {"outputs_by_key": {
	     "a": [{"status": 200, "body": "s"}, {"count": 1}],
	     "b": [{"status": 200, "body": "f"}, {"count": 1}]
	   },
	   "outside_outputs": [{"closed": true}, {"closed": true}]}},
	  {"name": "slow a, in input order",
	   "lookups": [
	     {"request": "GET /slow", "status": 200, "body": "s", "latency_ms": 3600000},
	     {"request": "GET /fast", "status": 200, "body": "f"}
	   ],
	   "input": [
	     {"key": "a", "value": "lookup /slow"},
	     {"key": "b", "value": "lookup /fast"}
	   ],
	   "expect": {"outputs": [{"status": 200, "body": "s"}, {"status": 200, "body": "f"}, {"closed": true}, {"closed": true}]}}
	]}`
	var tab Table
	if err := json.Unmarshal([]byte(table), &tab); err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		var out bytes.Buffer
		res, err := RunTable(context.Background(), bin, "user", &tab, &out)
		if !errors.Is(err, ErrFailed) || len(res) != 2 {
			t.Fatalf("RunTable = %v\n%s", err, out.String())
		}
		if len(res[0].Diff) != 0 {
			t.Errorf("per-key expectation failed: %q", res[0].Diff)
		}
		var order []string
		for _, o := range res[0].Outputs {
			order = append(order, o.Key+":"+string(o.Value))
		}
		want := []string{`b:{"status":200,"body":"f"}`, `b:{"count":1}`, `a:{"status":200,"body":"s"}`, `a:{"count":1}`}
		if len(order) < 4 || !slices.Equal(order[:4], want) {
			t.Errorf("outputs in sink order %q, want b's before a's: %q", order, want)
		}
		// The in-order expectation fails, with a diff showing b's output first.
		d := strings.Join(res[1].Diff, "\n")
		if !strings.Contains(d, `output 1: + {"status":200,"body":"f"}`) {
			t.Errorf("input-order case diff %q lacks b's output first", d)
		}
	})
}

// TestLookupFailureScripted: a scripted failure reaches the guest as its LOOKUP_* code, after
// its latency, and an unknown code name is a table error.
func TestLookupFailureScripted(t *testing.T) {
	bin, err := os.ReadFile("../../guest-sdk/testdata/conformance/conformance-c.wasm")
	if err != nil {
		t.Fatal(err)
	}
	const table = `{"cases": [
	  {"name": "timeout",
	   "lookups": [{"request": "GET /geo", "error": "LOOKUP_TIMEOUT", "latency_ms": 250}],
	   "input": [{"key": "a", "value": "lookup /geo"}, {"key": "a", "value": "count"}],
	   "expect": {"outputs": [{"error": "LOOKUP_TIMEOUT", "retryable": true}, {"count": 1}, {"closed": true}]}},
	  {"name": "wrong expectation",
	   "lookups": [{"request": "GET /geo", "error": "LOOKUP_REFUSED"}],
	   "input": [{"key": "a", "value": "lookup /geo"}],
	   "expect": {"outputs": [{"status": 200, "body": ""}, {"closed": true}]}},
	  {"name": "fault while a lookup is out",
	   "lookups": [{"request": "GET /geo", "status": 200, "latency_ms": 3600000}],
	   "input": [{"key": "a", "value": "lookup /geo"}, {"key": "b", "value": "fail boom"}],
	   "expect": {"outputs": [], "error": "failed on purpose: boom"}}
	]}`
	var tab Table
	if err := json.Unmarshal([]byte(table), &tab); err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		var out bytes.Buffer
		res, err := RunTable(context.Background(), bin, "user", &tab, &out)
		if !errors.Is(err, ErrFailed) || len(res) != 3 {
			t.Fatalf("RunTable = %v\n%s", err, out.String())
		}
		if len(res[0].Diff) != 0 {
			t.Errorf("timeout case: %q", res[0].Diff)
		}
		if len(res[2].Diff) != 0 {
			t.Errorf("fault case (the pending lookup is cancelled): %q", res[2].Diff)
		}
		if d := strings.Join(res[1].Diff, "\n"); !strings.Contains(d, `output 1: + {"error":"LOOKUP_REFUSED"`) {
			t.Errorf("refused case diff %q lacks the guest's LOOKUP_REFUSED output", d)
		}
	})
	tab.Cases[0].Lookups[0].Error = "LOOKUP_NOPE"
	if _, err := RunTable(context.Background(), bin, "user", &tab, io.Discard); err == nil || !strings.Contains(err.Error(), `unknown error "LOOKUP_NOPE"`) {
		t.Errorf("unknown code name: %v", err)
	}
}

// FuzzValue: any bytes survive a state value's JSON form (text as a string, else hex), and
// UnmarshalJSON never panics on what a user writes.
func FuzzValue(f *testing.F) {
	for _, s := range []string{"", "text", "\xff\x00", `{"i64": 5}`, `{"hex": "0g"}`, `"x"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		enc, err := json.Marshal(NewValue(b))
		if err != nil {
			t.Fatal(err)
		}
		var v Value
		if err := json.Unmarshal(enc, &v); err != nil || !bytes.Equal(v.Bytes(), b) {
			t.Fatalf("%q: encoded %s, decoded %q, %v", b, enc, v.Bytes(), err)
		}
		var w Value
		_ = w.UnmarshalJSON(b)
	})
}
