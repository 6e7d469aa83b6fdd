package migrate_test

import (
	"errors"
	"testing"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink"
	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/migrate"
)

var (
	_     = clink.NewState("other")
	count = clink.NewState("count")
)

func init() {
	clink.Register("m", clink.ProcessFunc(func(*clink.Record) error { return nil }))
	migrate.Set(3, []int{1, 2}, func(state string, from int, key, entry, value []byte) ([]byte, error) {
		switch {
		case state != count.Name():
			return nil, errors.New("state " + state)
		case string(key) == "drop":
			return nil, migrate.ErrDrop
		case string(key) == "panic":
			panic("boom")
		}
		return append(append(append([]byte{byte('0' + from)}, key...), entry...), value...), nil
	})
}

// TestMigrate: the installed function sees the state's name, the version, and the key, entry
// and value the host wrote to the input buffer; ErrDrop drops the entry; an error or a panic
// traps (a panic here); the versions export is the JSON the host reads.
func TestMigrate(t *testing.T) {
	if v := migrate.Versions(); v != `{"state_version":3,"migrates_from":[1,2]}` {
		t.Fatalf("versions %s", v)
	}
	if out, ok := migrate.Migrate(1, 2, []byte("k"), []byte("e"), []byte("v")); !ok || string(out) != "2kev" {
		t.Fatalf("migrate: %q %v", out, ok)
	}
	if _, ok := migrate.Migrate(1, 1, []byte("drop"), nil, []byte("v")); ok {
		t.Fatal("ErrDrop kept the entry")
	}
	for _, tc := range []struct {
		state uint32
		key   string
	}{{0, "k"}, {1, "panic"}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("state %d key %q: no trap", tc.state, tc.key)
				}
			}()
			migrate.Migrate(tc.state, 1, []byte(tc.key), nil, nil)
		}()
	}
}
