// Command migrate is version 2 of host/abi's migv1 counter, written with the Go SDK and
// migrated by the host through package clink/migrate: state "count" holds {"n":N} (version 1
// held N as 8 bytes little-endian), and a record whose stored value is in any other form fails,
// so an unmigrated value shows. Each record emits {"count":N,"v":2}. The migration drops the
// key "drop" and fails on the key "poison". host/pipeline TestHostMigrationSDKs runs it.
package main

import (
	"encoding/binary"
	"errors"
	"strconv"
	"strings"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink"
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/migrate"
)

var count = clink.NewState("count")

var out []byte

type op struct{}

func (op) Process(r *clink.Record) error {
	v, found, err := count.Get(nil)
	if err != nil {
		return err
	}
	var n int64
	if found {
		s, ok := strings.CutPrefix(string(v), `{"n":`)
		if s, ok = strings.CutSuffix(s, "}"); !ok {
			return errors.New("unmigrated value " + strconv.Quote(string(v)))
		}
		if n, err = strconv.ParseInt(s, 10, 64); err != nil {
			return err
		}
	}
	n++
	if err := count.Put(nil, append(strconv.AppendInt([]byte(`{"n":`), n, 10), '}')); err != nil {
		return err
	}
	return clink.Emit(r.Key, append(strconv.AppendInt(append(out[:0], `{"count":`...), n, 10), `,"v":2}`...))
}

func init() {
	clink.Register("migcount", op{})
	migrate.Set(2, []int{1}, func(state string, from int, key, entry, value []byte) ([]byte, error) {
		switch {
		case string(key) == "drop":
			return nil, migrate.ErrDrop
		case string(key) == "poison":
			return nil, errors.New("cannot migrate poison")
		case state != count.Name() || from != 1 || entry != nil || len(value) != 8:
			return nil, errors.New("unexpected entry")
		}
		n := int64(binary.LittleEndian.Uint64(value))
		out = append(strconv.AppendInt(append(out[:0], `{"n":`...), n, 10), '}')
		return out, nil
	})
}

func main() {}
