// Package migrate gives a clink operator host-driven state migration (docs/abi.md,
// "clink_migrate"): it declares the module's state version and the older versions it restores,
// and converts each stored value of such a version when the host restores it.
//
// Importing it adds the clink_migrate and clink_state_versions exports to the module, so only
// operators that migrate import it (Go links every //go:wasmexport of a package it links, and
// package clink's manifest is shared by every module: changing it would change every module's
// bytes). Call Set from an init function:
//
//	var counts = clink.NewState("counts")
//
//	func init() {
//		// Version 2 stores {"n":N}; version 1 stored the count as 8 bytes (PutInt64).
//		migrate.Set(2, []int{1}, func(state string, from int, key, entry, value []byte) ([]byte, error) {
//			if state != counts.Name() || len(value) != 8 {
//				return nil, errors.New("unexpected value")
//			}
//			n := int64(binary.LittleEndian.Uint64(value))
//			return strconv.AppendInt(append(out[:0], `{"n":`...), n, 10), nil
//		})
//	}
//
// On a restore from one of the from versions, the host calls the function for every stored
// entry, before any record: state is the entry's state name, key the record key, entry the
// entry within the key's map (nil for a per-key value), value the stored bytes. It returns
// the new value (which may alias its arguments or a buffer the function reuses), ErrDrop to
// delete the entry, or another error to fail the restore: the error is logged at error level
// and the call traps, so the host names it with the operator, state and key. A panic does the
// same. The function must be pure: the host allows no import inside it but log.
package migrate

import (
	"errors"
	"strconv"
	"strings"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink"
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/internal/abi"
)

// Func converts one stored value of state version from.
type Func func(state string, from int, key, entry, value []byte) ([]byte, error)

// ErrDrop is returned by a Func to delete the entry instead of rewriting it.
var ErrDrop = errors.New("migrate: drop the entry")

var (
	fn       Func
	versions []byte // the clink_state_versions JSON
	states   []string
)

// Set declares the module's state version and the versions it migrates from (docs/abi.md,
// "State versions on restore"), and installs f as the migration. Call it once, from an init
// function. It panics on a negative or repeated version.
func Set(version int, from []int, f Func) {
	if version < 0 {
		panic("migrate: negative state version " + strconv.Itoa(version))
	}
	b := []byte(`{"state_version":` + strconv.Itoa(version) + `,"migrates_from":[`)
	for i, v := range from {
		if v < 0 || v == version {
			panic("migrate: bad migrates_from version " + strconv.Itoa(v))
		}
		for _, w := range from[:i] {
			if w == v {
				panic("migrate: migrates_from lists " + strconv.Itoa(v) + " twice")
			}
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(v), 10)
	}
	versions, fn = append(b, "]}"...), f
}

// stateName maps a state index to its name, from the module's manifest (built by package
// clink from the states declared with clink.NewState, whose names need no JSON escaping).
func stateName(i uint32) string {
	if states == nil {
		m := string(abi.Exports.Manifest())
		_, rest, _ := strings.Cut(m, `"states":[`)
		list, _, _ := strings.Cut(rest, "]")
		for _, q := range strings.Split(list, ",") {
			if q != "" {
				states = append(states, strings.Trim(q, `"`))
			}
		}
	}
	if int(i) < len(states) {
		return states[i]
	}
	return "#" + strconv.Itoa(int(i))
}

// compute runs the migration over the entry the host wrote to the input buffer. It returns
// the new value, or ok=false to drop the entry; it panics (a trap) on an error.
func compute(state, from, keyLen, entryLen, valueLen uint32) (out []byte, ok bool) {
	if fn == nil {
		panic("migrate: clink_migrate called but migrate.Set was never called")
	}
	in := abi.Input
	key := in[:keyLen:keyLen]
	entry := in[keyLen : keyLen+entryLen : keyLen+entryLen]
	if entryLen == 0 {
		entry = nil
	}
	end := keyLen + entryLen + valueLen
	value := in[keyLen+entryLen : end : end]
	name := stateName(state)
	out, err := run(name, int(int32(from)), key, entry, value)
	if errors.Is(err, ErrDrop) {
		return nil, false
	}
	if err != nil {
		clink.Log(clink.LevelError, "migrating state "+strconv.Quote(name)+" from version "+strconv.Itoa(int(int32(from)))+": "+err.Error())
		panic(err)
	}
	return out, true
}

// run calls fn, turning a panic into an error (logged by compute before it traps).
func run(name string, from int, key, entry, value []byte) (out []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			if e, ok := r.(error); ok {
				err = e
			} else if s, ok := r.(string); ok {
				err = errors.New(s)
			} else {
				err = errors.New("panic in the migration function")
			}
		}
	}()
	return fn(name, from, key, entry, value)
}
