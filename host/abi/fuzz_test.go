package abi

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"testing"
)

// FuzzImports drives every clink_v1 import through the probe module with arbitrary arguments:
// any pointer, any length, any state or endpoint index. The host must never panic, must answer
// with a documented result code, and must never write guest memory outside the buffers the
// guest named (docs/abi.md, "Memory ownership").
func FuzzImports(f *testing.F) {
	f.Add(bytes.Join([][]byte{op(1, 0, 1024, 5, 1030, 16), op(0, 0, 1024, 5, 2048, 4), op(3, 2048, 64)}, nil))
	f.Add(bytes.Join([][]byte{op(10, 0, 1024, 22, 4096, 8), op(3, 4096, 1<<16)}, nil))
	f.Add(op(0, 1, 0xFFFFFFF0, 0x20, 0, 0))
	f.Add(op(4, 0xFFFFFFFF, 1, 0, 0xFFFFFFFF))
	f.Add(op(9, -1, 131070, 100))
	f.Add(op(11, 1))
	f.Add(bytes.Join([][]byte{op(13, 2048, 64), op(12, 2048, 8), op(14), op(13, 0, 0)}, nil))
	f.Add(bytes.Join([][]byte{op(5, -1), op(6, 1<<62), op(7), op(8)}, nil))

	e := newEngine(f, Limits{MaxStateKey: 256, MaxStateValue: 1 << 16, MaxEmitsPerCall: 64, MemoryPages: 8})
	m := load(f, e, "probe", "ep")
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, script []byte) {
		if len(script) > 48*64 {
			script = script[:48*64]
		}
		script = script[:len(script)/48*48]
		h := newRec()
		h.lookup = func(ep uint32, req []byte) (int, []byte, error) {
			if len(req)%3 == 0 {
				return 0, nil, LookupTimeout
			}
			return 200, bytes.Repeat([]byte{'r'}, len(req)), nil
		}
		in, err := m.Instantiate(ctx, h)
		if err != nil {
			t.Fatal(err)
		}
		defer in.Close(ctx)
		// Fill memory with a pattern so stray writes show up.
		size := in.mem.Size()
		pattern := bytes.Repeat([]byte{0xA5}, int(size))
		in.mem.Write(0, pattern)
		before, _ := in.mem.Read(0, size)
		before = bytes.Clone(before)

		err = in.Process([]byte("key"), script, 1)
		if err != nil {
			var fault *Fault
			if !errors.As(err, &fault) {
				t.Fatalf("non-fault error: %v", err)
			}
			// A store8 out of bounds, memory.grow, or an unknown op traps in the guest itself;
			// those are guest faults, not host bugs.
			if fault.Kind != FaultTrap && fault.Kind != FaultOutOfMemory && fault.Kind != FaultABI {
				t.Fatalf("unexpected fault kind %v: %v", fault.Kind, err)
			}
			return
		}
		after, _ := in.mem.Read(0, size)
		allowed := make([]bool, size)
		mark := func(off, n uint64) {
			for i := off; i < off+n && i < uint64(size); i++ {
				allowed[i] = true
			}
		}
		n := len(script) / 48
		mark(probeIn, uint64(3+len(script)))
		mark(probeResults, uint64(8*n))
		for i := range n {
			e := script[48*i:]
			arg := func(j int) uint64 { return binary.LittleEndian.Uint64(e[8*(j+1):]) }
			switch binary.LittleEndian.Uint64(e) {
			case 0, 10: // get_async, lookup write into (d, e)
				mark(uint64(uint32(arg(3))), uint64(uint32(arg(4))))
			case 3: // take_result writes into (a, b)
				mark(uint64(uint32(arg(0))), uint64(uint32(arg(1))))
			case 12: // the guest's own store
				mark(uint64(uint32(arg(0))), 1)
			case 13: // a drained output area's used counter is reset
				mark(uint64(uint32(arg(0))), 4)
			}
		}
		for i := range before {
			if before[i] != after[i] && !allowed[i] {
				t.Fatalf("host wrote guest memory at %d, outside every buffer the guest named", i)
			}
		}
		// Every result must be a documented code or a plausible value.
		res := h.emits[len(h.emits)-1][1]
		for i := 0; i+8 <= len(res); i += 8 {
			code := int64(binary.LittleEndian.Uint64([]byte(res[i:])))
			opc := binary.LittleEndian.Uint64(script[48*(i/8):])
			if (opc <= 6 || opc == 13 || opc == 14) && int32(code) < 0 {
				if _, ok := codeNames[Code(int32(code))]; !ok {
					t.Fatalf("op %d returned undocumented code %d", opc, code)
				}
			}
		}
	})
}
