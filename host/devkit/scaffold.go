package devkit

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Scaffold creates a new project called name in the new directory dir, in language lang,
// against the guest SDKs in sdk (an absolute guest-sdk directory). The project builds and
// passes its tests at once: a keyed counter operator, its manifest, a test table of two cases,
// a sample input and a README with the next commands. dir must not exist, or be empty.
func Scaffold(dir, lang, name, sdk string) (*Project, error) {
	p := &Project{Lang: lang, Name: name, SDK: sdk, Key: "user"}
	if err := p.validate(); err != nil {
		return nil, err
	}
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return nil, fmt.Errorf("%s exists and is not empty", dir)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	files := map[string]string{
		"manifest.json": `{"abi":1,"name":"` + name + `","states":["count"],"prefetch":["count"],"endpoints":[]}` + "\n",
		"tests.json":    testsTemplate,
		"input.jsonl":   "{\"user\":\"alice\",\"page\":\"/\"}\n{\"user\":\"bob\",\"page\":\"/cart\"}\n{\"user\":\"alice\",\"page\":\"/checkout\"}\n",
		"README.md":     readme(p),
		".gitignore":    "/" + p.Module() + "\n/.build/\n/.clink/\n",
	}
	switch lang {
	case "go":
		files["go.mod"] = "module " + name + "\n\ngo 1.24\n\nrequire github.com/clink-wasm/clink-wasm/guest-sdk/go v0.0.0\n\n" +
			"// The SDK of a local clink-wasm checkout; drop this line to use a tagged release.\n" +
			"replace github.com/clink-wasm/clink-wasm/guest-sdk/go => " + filepath.Join(sdk, "go") + "\n"
		files["main.go"] = strings.ReplaceAll(goTemplate, "NAME", name)
	case "as":
		rel, err := filepath.Rel(abs, filepath.Join(sdk, "assemblyscript", "assembly"))
		if err != nil {
			return nil, err
		}
		rel = filepath.ToSlash(rel)
		if !strings.HasPrefix(rel, ".") {
			rel = "./" + rel
		}
		files["index.ts"] = strings.NewReplacer("NAME", name, "SDK", rel).Replace(asTemplate)
	case "c":
		files["main.c"] = strings.ReplaceAll(cTemplate, "NAME", name)
	case "rust":
		files["lib.rs"] = strings.ReplaceAll(rustTemplate, "NAME", name)
	}
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return nil, err
	}
	files[ProjectFile] = string(b) + "\n"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(files[n]), 0o644); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Source is the operator's source file of a project in lang.
func Source(lang string) string {
	switch lang {
	case "go":
		return "main.go"
	case "as":
		return "index.ts"
	case "c":
		return "main.c"
	default:
		return "lib.rs"
	}
}

func readme(p *Project) string {
	return "# " + p.Name + "\n\n" +
		"A clink-wasm operator in " + map[string]string{"go": "Go", "as": "AssemblyScript", "c": "C", "rust": "Rust"}[p.Lang] +
		" (" + Source(p.Lang) + "). It counts records per `" + p.Key + "` and emits\n" +
		"`{\"key\":K,\"count\":N}` for each record, keeping the count in the prefetched state `count`.\n\n" +
		"Next:\n\n```sh\n" +
		"clink-wasm build          # compile " + Source(p.Lang) + " into " + p.Module() + ", embed manifest.json, report what the host sees\n" +
		"clink-wasm test           # run the cases of tests.json against " + p.Module() + " in the production host\n" +
		"clink-wasm run --module " + p.Module() + " --input input.jsonl --key " + p.Key + "\n" +
		"```\n\n" +
		"Files: `clink.json` (language, name, where the SDK is), `manifest.json` (what the module\n" +
		"declares: keep it in step with the states and endpoints the source declares; `build` checks\n" +
		"that they agree), `tests.json` (the test table: input records, optional initial state,\n" +
		"scripted lookup responses and watermarks, expected outputs, state or error), `input.jsonl`\n" +
		"(a sample input). The guest ABI is docs/abi.md in the clink-wasm repository; the SDK's\n" +
		"README is in " + filepath.Join(p.SDK, sdkDir(p.Lang)) + ".\n"
}

func sdkDir(lang string) string {
	if lang == "as" {
		return "assemblyscript"
	}
	return lang
}

const testsTemplate = `{
  "cases": [
    {
      "name": "counts per key",
      "input": [
        {"value": {"user": "alice", "page": "/"}},
        {"value": {"user": "bob", "page": "/cart"}},
        {"value": {"user": "alice", "page": "/checkout"}}
      ],
      "expect": {
        "outputs": [
          {"key": "alice", "count": 1},
          {"key": "bob", "count": 1},
          {"key": "alice", "count": 2}
        ],
        "state": {"alice": {"count": {"": {"i64": 2}}}, "bob": {"count": {"": {"i64": 1}}}}
      }
    },
    {
      "name": "continues from the stored count",
      "state": {"carol": {"count": {"": {"i64": 41}}}},
      "input": [{"value": {"user": "carol"}}],
      "expect": {"outputs": [{"key": "carol", "count": 42}]}
    }
  ]
}
`

const goTemplate = `// Command NAME is a clink-wasm operator: it counts records per key and emits
// {"key":K,"count":N} for every record.
package main

import (
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink"
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/jsonx"
)

// counts holds one int64 per record key. Prefetched: the host delivers it with each record
// and takes it back written, so the read-modify-write makes no import call.
var counts = clink.NewState("count", clink.Prefetch())

var out []byte // reused for every record

// With -buildmode=c-shared, main never runs: the host calls _initialize, which runs init.
func init() { clink.Register("NAME", clink.ProcessFunc(process)) }

func process(r *clink.Record) error {
	n, _, err := counts.GetInt64(nil)
	if err != nil {
		return err
	}
	n++
	if err := counts.PutInt64(nil, n); err != nil {
		return err
	}
	out = append(out[:0], ` + "`" + `{"key":` + "`" + `...)
	out = jsonx.AppendString(out, r.Key)
	out = append(out, ` + "`" + `,"count":` + "`" + `...)
	out = jsonx.AppendInt(out, n)
	out = append(out, '}')
	return clink.Emit(r.Key, out)
}

func main() {}
`

const asTemplate = `// NAME is a clink-wasm operator: it counts records per key and emits {"key":K,"count":N} for
// every record.
import { Operator, Record, State, Buffer, register, emit } from "SDK";
export * from "SDK/exports";

// One int64 per record key. Prefetched: the host delivers it with each record and takes it
// back written, so the read-modify-write makes no import call.
const counts = new State("count", { prefetch: true });
const out = new Buffer(64); // reused for every record

class Counter extends Operator {
  process(record: Record): void {
    let n = counts.getI64("") + 1;
    counts.putI64("", n);
    out.clear().append('{"key":').appendJsonString(record.key).append(',"count":').appendInt(n).appendByte(0x7D);
    emit(record.key, out);
  }
}

register("NAME", new Counter());
`

const cTemplate = `/* NAME is a clink-wasm operator: it counts records per key and emits {"key":K,"count":N}
 * for every record. */
#include "clink.h"

/* One int64 per record key. Prefetched: the host delivers it with each record and takes it
 * back written, so the read-modify-write makes no import call. */
static clink_state *counts;
static clink_buf out; /* reused for every record */

static int process(const clink_record *r) {
	int64_t n;
	int32_t rc = clink_state_get_i64(counts, NULL, 0, &n);
	if (rc < 0)
		return rc;
	if ((rc = clink_state_put_i64(counts, NULL, 0, ++n)) < 0)
		return rc;
	clink_buf_reset(&out);
	clink_buf_append_str(&out, "{\"key\":");
	clink_buf_json_string(&out, r->key, r->key_len);
	clink_buf_append_str(&out, ",\"count\":");
	clink_buf_append_i64(&out, n);
	clink_buf_append_byte(&out, '}');
	return clink_emit(r->key, r->key_len, out.data, out.len);
}

/* Runs once per instance, before the host reads the manifest. */
void clink_init(void) {
	static const clink_operator op = {process, NULL, NULL, NULL};
	clink_register("NAME", &op);
	counts = clink_state_new("count", CLINK_PREFETCH);
}
`

const rustTemplate = `//! NAME is a clink-wasm operator: it counts records per key and emits {"key":K,"count":N}
//! for every record.
use clink::{json, Operator, Record, State};

struct Counter {
    // One int64 per record key. Prefetched: the host delivers it with each record and takes
    // it back written, so the read-modify-write makes no import call.
    counts: State,
    out: Vec<u8>, // reused for every record
}

impl Operator for Counter {
    fn process(&mut self, r: &Record) -> clink::Result<()> {
        let n = self.counts.get_i64(b"")?.unwrap_or(0) + 1;
        self.counts.put_i64(b"", n)?;
        self.out.clear();
        self.out.extend_from_slice(b"{\"key\":");
        json::append_string(&mut self.out, r.key);
        self.out.extend_from_slice(b",\"count\":");
        json::append_int(&mut self.out, n);
        self.out.push(b'}');
        clink::emit(r.key, &self.out)
    }
}

// The constructor declares the states; the SDK runs it once per instance.
clink::export_operator!("NAME", || Counter { counts: State::new("count", clink::PREFETCH), out: Vec::new() });
`
