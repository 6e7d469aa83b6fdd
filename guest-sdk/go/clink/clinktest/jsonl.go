//go:build !wasip1

package clinktest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/jsonx"
)

// KeyOf keys a JSON record by a top-level field the way `clink-wasm run --key FIELD` does: a
// string field gives its unescaped UTF-8 text, any other value its JSON text as written.
func KeyOf(record []byte, field string) ([]byte, error) {
	raw, ok := jsonx.Field(record, field)
	if !ok {
		return nil, fmt.Errorf("no field %q", field)
	}
	if raw[0] != '"' {
		return raw, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, err
	}
	return []byte(s), nil
}

// RunJSONL runs every line of in (JSON Lines, blank lines skipped) through a fresh Harness,
// keyed by keyField with timestamp 0, closes it, and returns the emitted values one per line:
// what `clink-wasm run --key keyField` writes for the same input.
func RunJSONL(in io.Reader, keyField string) ([]byte, error) {
	h, err := New()
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	write := func(os []Output) {
		for _, o := range os {
			out.Write(o.Value)
			out.WriteByte('\n')
		}
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(nil, 16<<20)
	for line := 1; sc.Scan(); line++ {
		rec := bytes.TrimSpace(sc.Bytes())
		if len(rec) == 0 {
			continue
		}
		key, err := KeyOf(rec, keyField)
		if err != nil {
			return out.Bytes(), fmt.Errorf("line %d: %w", line, err)
		}
		o, err := h.Process(key, rec, 0)
		write(o)
		if err != nil {
			return out.Bytes(), fmt.Errorf("line %d: %w", line, err)
		}
	}
	if err := sc.Err(); err != nil {
		return out.Bytes(), err
	}
	o, err := h.Close()
	write(o)
	return out.Bytes(), err
}
