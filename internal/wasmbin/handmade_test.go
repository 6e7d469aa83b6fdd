package wasmbin_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/clink-wasm/clink-wasm/internal/wasmbin"
)

// A few helpers to assemble modules by hand, for encodings wat2wasm cannot
// produce (typed function references, table initialisers) and for malformed
// input.

func leb(v uint32) []byte {
	var b []byte
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func str(s string) []byte { return cat(leb(uint32(len(s))), []byte(s)) }

// vec encodes a vector of already encoded items.
func vec(items ...[]byte) []byte { return cat(leb(uint32(len(items))), cat(items...)) }

// sec encodes a section.
func sec(id byte, content ...[]byte) []byte {
	b := cat(content...)
	return cat([]byte{id}, leb(uint32(len(b))), b)
}

// wasm encodes a module.
func wasm(sections ...[]byte) []byte {
	return cat([]byte("\x00asm\x01\x00\x00\x00"), cat(sections...))
}

// body encodes a code section entry: locals (already a vector) and code.
func body(locals []byte, code ...byte) []byte {
	b := cat(locals, code)
	return cat(leb(uint32(len(b))), b)
}

var noLocals = vec()

// typedRefs uses the typed function references proposal: call_ref,
// return_call_ref, ref.as_non_null, br_on_null, br_on_non_null, a local of
// type (ref null $t), block types 0x63/0x64 with a heap type, and a table
// with an initialiser expression (0x40 0x00 prefix) holding ref.func.
// It also has a () -> i32 type, which the fuel import reuses.
var typedRefs = wasm(
	sec(1, vec( // types
		[]byte{0x60, 1, 0x7f, 1, 0x7f}, // 0: (i32) -> i32
		[]byte{0x60, 0, 1, 0x7f},       // 1: () -> i32
	)),
	sec(3, vec([]byte{0}, []byte{0}, []byte{0}, []byte{1}, []byte{1}, []byte{1}, []byte{1})),
	sec(4, vec( // table: 0x40 0x00 funcref, min 1, init (ref.func $inc)
		[]byte{0x40, 0x00, 0x70, 0x00, 0x01, 0xd2, 0x00, 0x0b},
	)),
	sec(7, vec(
		cat(str("apply_ref"), []byte{0x00, 1}),
		cat(str("tail_ref"), []byte{0x00, 2}),
		cat(str("null_check"), []byte{0x00, 3}),
		cat(str("via_table"), []byte{0x00, 4}),
		cat(str("local_ref"), []byte{0x00, 5}),
		cat(str("loop_ref"), []byte{0x00, 6}),
	)),
	sec(9, vec([]byte{0x03, 0x00, 0x01, 0x00})), // elem declare func $inc
	sec(10, vec(
		// $inc: local.get 0; i32.const 1; i32.add
		body(noLocals, 0x20, 0, 0x41, 1, 0x6a, 0x0b),
		// apply_ref: local.get 0; ref.func $inc; call_ref 0
		body(noLocals, 0x20, 0, 0xd2, 0, 0x14, 0, 0x0b),
		// tail_ref: local.get 0; ref.func $inc; ref.as_non_null; return_call_ref 0
		body(noLocals, 0x20, 0, 0xd2, 0, 0xd4, 0x15, 0, 0x0b),
		// null_check: block; ref.null 0; br_on_null 0; drop; i32.const 1; return; end; i32.const 0
		body(noLocals, 0x02, 0x40, 0xd0, 0, 0xd5, 0, 0x1a, 0x41, 1, 0x0f, 0x0b, 0x41, 0, 0x0b),
		// via_table: i32.const 41; i32.const 0; call_indirect 0 0
		body(noLocals, 0x41, 41, 0x41, 0, 0x11, 0, 0, 0x0b),
		// local_ref (local $r (ref null 0)): local.set $r (ref.func $inc); i32.const 7;
		// block (result (ref null 0)) local.get $r; br_on_non_null 0; ref.null 0 end; call_ref 0
		body(vec([]byte{1, 0x63, 0}), 0xd2, 0, 0x21, 0, 0x41, 7,
			0x02, 0x63, 0, 0x20, 0, 0xd6, 0, 0xd0, 0, 0x0b, 0x14, 0, 0x0b),
		// loop_ref: i32.const 5; loop (result (ref 0)) ref.func $inc end; call_ref 0
		body(noLocals, 0x41, 5, 0x03, 0x64, 0, 0xd2, 0, 0x0b, 0x14, 0, 0x0b),
	)),
)

func TestTypedFunctionReferences(t *testing.T) {
	out := instrument(t, typedRefs)
	// The () -> i32 type is reused, so the type section is unchanged.
	types := typedRefs[8 : 8+2+10]
	if !bytes.HasPrefix(out[8:], types) {
		t.Errorf("type section changed: got % x, want % x", out[8:8+len(types)], types)
	}
	orig := instantiate(t, typedRefs, nil)
	f := &fuel{refill: 2}
	inst := instantiate(t, out, f)
	ctx := context.Background()
	for _, c := range []call{
		c("apply_ref", 41).returns(42),
		c("tail_ref", 1).returns(2),
		c("null_check").returns(0),
		c("via_table").returns(42),
		c("local_ref").returns(8),
		c("loop_ref").returns(6),
	} {
		want, err := callExport(ctx, orig, c.fn, c.args...)
		if err != nil {
			t.Fatalf("original %s: %v", c.fn, err)
		}
		got, err := callExport(ctx, inst, c.fn, c.args...)
		if err != nil {
			t.Fatalf("instrumented %s: %v", c.fn, err)
		}
		if got[0] != want[0] || want[0] != c.want[0] {
			t.Errorf("%s%v: instrumented %v, original %v, want %v", c.fn, c.args, got, want, c.want)
		}
	}
	if f.calls == 0 {
		t.Error("the fuel import was never called")
	}
}

// oneFunc returns a module with one () -> () function with the given body.
func oneFunc(code ...byte) []byte {
	return wasm(
		sec(1, vec([]byte{0x60, 0, 0})),
		sec(3, vec([]byte{0})),
		sec(10, vec(body(noLocals, code...))),
	)
}

// Offset of the first instruction of oneFunc's body.
const oneFuncCode = 8 + 6 + 4 + 5

func TestInstrumentErrors(t *testing.T) {
	tests := []struct {
		name   string
		bin    []byte
		kind   error
		offset int    // -1: not checked
		msg    string // a substring of the message
	}{
		{"empty input", nil, wasmbin.ErrMalformed, 0, "magic"},
		{"bad magic", []byte("\x00asx\x01\x00\x00\x00"), wasmbin.ErrMalformed, 0, "magic"},
		{"version 2", []byte("\x00asm\x02\x00\x00\x00"), wasmbin.ErrUnsupported, 4, "version"},
		{"component", []byte("\x00asm\x0d\x00\x01\x00"), wasmbin.ErrUnsupported, 4, "version"},
		{"truncated section", cat(wasm(), []byte{1, 5, 1}), wasmbin.ErrMalformed, 8, "claims 5 bytes"},
		{"truncated size", cat(wasm(), []byte{1, 0x80}), wasmbin.ErrMalformed, 10, "unexpected end"},
		{"section out of order", wasm(sec(3, vec()), sec(1, vec())), wasmbin.ErrMalformed, 11, "out of order"},
		{"section repeated", wasm(sec(1, vec()), sec(1, vec())), wasmbin.ErrMalformed, 11, "out of order"},
		{"tag after global", wasm(sec(6, vec()), sec(13, vec())), wasmbin.ErrMalformed, 11, "out of order"},
		{"datacount after code", wasm(sec(10, vec()), sec(12, []byte{0})), wasmbin.ErrMalformed, 11, "out of order"},
		{"unknown section", wasm(sec(14, nil)), wasmbin.ErrMalformed, 8, "unknown section id 14"},
		{"section with trailing bytes", wasm(sec(1, vec(), []byte{0})), wasmbin.ErrMalformed, 11, "unread bytes"},
		{"LEB128 too long", wasm(sec(3, []byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x00})), wasmbin.ErrMalformed, 10, "longer than 5 bytes"},
		{"LEB128 overflow", wasm(sec(3, []byte{0x80, 0x80, 0x80, 0x80, 0x10})), wasmbin.ErrMalformed, 10, "overflows"},
		{"vector longer than section", wasm(sec(3, []byte{5, 0})), wasmbin.ErrMalformed, 10, "vector length 5"},
		{"bad custom section name", wasm(sec(0, []byte{9, 'x'})), wasmbin.ErrMalformed, -1, ""},
		{"reserved function import",
			wasm(sec(1, vec([]byte{0x60, 0, 1, 0x7f})), sec(2, vec(cat(str("clink_internal"), str("fuel_exhausted"), []byte{0, 0})))),
			wasmbin.ErrReservedImport, 18, `"clink_internal"`},
		{"reserved export name",
			wasm(sec(5, vec([]byte{0, 1})), sec(7, vec(cat(str("memory"), []byte{2, 0}), cat(str("clink_internal.fuel"), []byte{2, 0})))),
			wasmbin.ErrReservedExport, -1, "export 1"},
		{"reserved global import",
			wasm(sec(2, vec(cat(str("env"), str("x"), []byte{3, 0x7f, 0}), cat(str("clink_internal"), str("g"), []byte{3, 0x7f, 1})))),
			wasmbin.ErrReservedImport, -1, "import 1"},
		{"GC struct type", wasm(sec(1, vec([]byte{0x5f, 0}))), wasmbin.ErrUnsupported, 11, "GC proposal"},
		{"GC subtype", wasm(sec(1, vec([]byte{0x50, 0, 0x60, 0, 0}))), wasmbin.ErrUnsupported, 11, "GC proposal"},
		{"GC struct in rec group", wasm(sec(1, vec([]byte{0x4e, 1, 0x5f, 0}))), wasmbin.ErrUnsupported, 13, "not a function type"},
		{"GC value type", wasm(sec(1, vec([]byte{0x60, 1, 0x6e, 0}))), wasmbin.ErrUnsupported, 13, "GC proposal value type 0x6e"},
		{"bad value type", wasm(sec(1, vec([]byte{0x60, 1, 0x00, 0}))), wasmbin.ErrMalformed, 13, "invalid value type 0x00"},
		{"memory64 limits", wasm(sec(2, vec(cat(str("env"), str("m"), []byte{2, 4, 0})))), wasmbin.ErrUnsupported, -1, "memory64"},
		{"unknown opcode", oneFunc(0x01, 0xd3, 0x0b), wasmbin.ErrUnsupported, oneFuncCode + 1, "unknown opcode 0xd3"},
		{"unknown SIMD opcode", oneFunc(0xfd, 0x9a, 0x01, 0x0b), wasmbin.ErrUnsupported, oneFuncCode, "unknown opcode 0xfd 0x9a"},
		{"unknown misc opcode", oneFunc(0xfc, 18, 0x0b), wasmbin.ErrUnsupported, oneFuncCode, "unknown opcode 0xfc 18"},
		{"unknown atomic opcode", oneFunc(0xfe, 0x04, 0x0b), wasmbin.ErrUnsupported, oneFuncCode, "unknown opcode 0xfe 0x04"},
		{"legacy try", oneFunc(0x06, 0x40, 0x0b, 0x0b), wasmbin.ErrUnsupported, oneFuncCode, "legacy exception handling"},
		{"legacy delegate", oneFunc(0x18, 0, 0x0b), wasmbin.ErrUnsupported, oneFuncCode, "legacy exception handling"},
		{"bad catch kind", oneFunc(0x1f, 0x40, 1, 7, 0, 0x0b, 0x0b), wasmbin.ErrMalformed, oneFuncCode + 3, "catch kind"},
		{"select with two types", oneFunc(0x1c, 2, 0x7f, 0x7f, 0x0b), wasmbin.ErrMalformed, oneFuncCode, "select"},
		// wazero validates this with default features, then its compiler
		// panics reading 0x70 as i32.rem_u.
		{"select with a typed reference type",
			oneFunc(0xd0, 0x70, 0xd0, 0x70, 0x41, 1, 0x1c, 1, 0x63, 0x70, 0x1a, 0x0b),
			wasmbin.ErrUnsupported, oneFuncCode + 6, "miscompiles"},
		{"immediate past end of body", oneFunc(0x28, 0x0b), wasmbin.ErrMalformed, oneFuncCode + 2, "unexpected end"},
		{"body without end", oneFunc(0x01), wasmbin.ErrMalformed, oneFuncCode - 1, "end opcode"},
		{"global.get of $fuel", oneFunc(0x23, 0, 0x1a, 0x0b), wasmbin.ErrMalformed, oneFuncCode + 1, "global index 0 out of range"},
		{"global.set of $fuel",
			wasm(
				sec(1, vec([]byte{0x60, 0, 0})),
				sec(3, vec([]byte{0})),
				sec(6, vec([]byte{0x7f, 1, 0x41, 0, 0x0b})),
				sec(10, vec(body(noLocals, 0x41, 0x7f, 0x24, 1, 0x0b))),
			),
			wasmbin.ErrMalformed, -1, "global index 1 out of range (the module has 1 globals)"},
		{"global initialiser reads $fuel", wasm(sec(6, vec([]byte{0x7f, 0, 0x23, 1, 0x0b}))), wasmbin.ErrMalformed, 14, "global index 1"},
		{"export of $fuel", wasm(sec(7, vec(cat(str("fuel"), []byte{3, 0})))), wasmbin.ErrMalformed, 17, "global index 0"},
		{"bad constant expression", wasm(sec(6, vec([]byte{0x7f, 0, 0x20, 0, 0x0b}))), wasmbin.ErrMalformed, 13, "not allowed in a constant expression"},
		{"bad element flags", wasm(sec(9, vec([]byte{8}))), wasmbin.ErrMalformed, 11, "element segment flags 8"},
		{"bad data flags", wasm(sec(11, vec([]byte{3}))), wasmbin.ErrMalformed, 11, "data segment flags 3"},
		{"code without functions", wasm(sec(10, vec(body(noLocals, 0x0b)))), wasmbin.ErrMalformed, 10, "declares 0"},
		{"functions without code", wasm(sec(1, vec([]byte{0x60, 0, 0})), sec(3, vec([]byte{0}))), wasmbin.ErrMalformed, -1, "without code"},
		{"too many locals",
			wasm(sec(1, vec([]byte{0x60, 0, 0})), sec(3, vec([]byte{0})), sec(10, vec(body(vec([]byte{0xff, 0xff, 0x03, 0x7f}), 0x0b)))),
			wasmbin.ErrUnsupported, 23, "more than 50000 locals"},
		{"tag section longer than its bytes", wasm(sec(13, []byte{0xc3, 0xc3, 0xc3, 0x03, 0, 0})), wasmbin.ErrMalformed, 10, "vector length"},
		{"body size past section", wasm(sec(1, vec([]byte{0x60, 0, 0})), sec(3, vec([]byte{0})), sec(10, []byte{1, 9, 0, 0x0b})),
			wasmbin.ErrMalformed, -1, "claims 9 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := wasmbin.Instrument(tt.bin)
			if !errors.Is(err, tt.kind) {
				t.Fatalf("got %v, want %v", err, tt.kind)
			}
			if out != nil {
				t.Error("output returned with an error")
			}
			var e *wasmbin.Error
			if !errors.As(err, &e) {
				t.Fatalf("%T is not a *wasmbin.Error", err)
			}
			if tt.offset >= 0 && e.Offset != tt.offset {
				t.Errorf("offset %#x, want %#x (%v)", e.Offset, tt.offset, err)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q does not mention %q", err, tt.msg)
			}
		})
	}
}

// nameSubsections returns the subsection ids of the name section of bin,
// and whether it has one.
func nameSubsections(t *testing.T, bin []byte) ([]byte, bool) {
	t.Helper()
	p := bin[8:]
	next := func() uint32 { // LEB128, well-formed input only
		var v uint32
		for shift := 0; ; shift += 7 {
			b := p[0]
			p = p[1:]
			v |= uint32(b&0x7f) << shift
			if b < 0x80 {
				return v
			}
		}
	}
	for len(p) > 0 {
		id := p[0]
		p = p[1:]
		size := next()
		content, rest := p[:size], p[size:]
		p = content
		if id == 0 && string(p[1:1+p[0]]) == "name" {
			p = p[1+p[0]:]
			var ids []byte
			for len(p) > 0 {
				ids = append(ids, p[0])
				p = p[1:]
				p = p[next():]
			}
			return ids, true
		}
		p = rest
	}
	return nil, false
}

func TestNameSubsections(t *testing.T) {
	names := func(subsections ...[]byte) []byte {
		return wasm(
			sec(1, vec([]byte{0x60, 0, 0})),
			sec(3, vec([]byte{0})),
			sec(10, vec(body(noLocals, 0x03, 0x40, 0x0b, 0x0b))),
			sec(0, str("name"), cat(subsections...)),
		)
	}
	sub := func(id byte, content ...[]byte) []byte { return sec(id, content...) }
	tests := []struct {
		name string
		bin  []byte
		want string // subsection ids of the output, or "none"
	}{
		{
			name: "labels and unknown subsections are dropped",
			bin: names(
				sub(0, str("m")),
				sub(1, vec(cat(leb(0), str("f")))),
				sub(2, vec(cat(leb(0), vec(cat(leb(0), str("x")))))),
				sub(3, vec(cat(leb(0), vec(cat(leb(0), str("l")))))),
				sub(7, vec(cat(leb(0), str("g")))),
				sub(12, []byte{1, 2, 3}),
			),
			want: "\x00\x01\x02\x07",
		},
		{
			name: "no function names, none added",
			bin:  names(sub(0, str("m"))),
			want: "\x00",
		},
		{
			name: "malformed subsection drops the section",
			bin:  names(sub(1, vec(cat(leb(0), []byte{9, 'f'})))),
			want: "none",
		},
		{
			name: "truncated subsection drops the section",
			bin:  names([]byte{1, 40, 0}),
			want: "none",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := instrument(t, tt.bin)
			ids, ok := nameSubsections(t, out)
			got := string(ids)
			if !ok {
				got = "none"
			}
			if got != tt.want {
				t.Errorf("name subsections %q, want %q", got, tt.want)
			}
			// wazero must accept the output, name section included.
			if _, err := newRuntime(t).CompileModule(context.Background(), out); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestSIMDOpcodeByte checks that SIMD sub-opcodes are decoded as wazero
// decodes them, one byte, rather than as LEB128 like the spec says. Here
// 0xfd 0x8c 0x00 is v128.const (0x0c, padded) and 16 bytes of immediate to a
// spec decoder, but to wazero i16x8.shr_s (0x8c), unreachable (0x00) and then
// a loop. The loop must get its fuel check.
func TestSIMDOpcodeByte(t *testing.T) {
	bin := oneFunc(
		0x00,             // unreachable
		0xfd, 0x8c, 0x00, // see above
		0x03, 0x40, 0x0c, 0x00, 0x0b, // loop; br 0; end
		0x0b)
	if _, err := newRuntime(t).CompileModule(context.Background(), bin); err != nil {
		t.Fatalf("wazero no longer accepts the input (did its decoder change?): %v", err)
	}
	out := instrument(t, bin)
	if _, err := newRuntime(t).CompileModule(context.Background(), out); err != nil {
		t.Fatal(err)
	}
	// The check after the loop's block type, with the fuel import as function 0.
	loopCheck := []byte{0x03, 0x40, 0x02, 0x40, 0x23}
	if !bytes.Contains(out, loopCheck) {
		t.Errorf("no fuel check after the loop: % x", out)
	}
}
