package gen

import (
	"context"
	"encoding/json"
	"io"
	"slices"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

func source(t *testing.T, opts map[string]any) *Source {
	co := pipeline.NewOptions("sources[0]", opts)
	s, err := New(&pipeline.SourceSpec{Name: "g"}, co, &pipeline.Env{})
	if err != nil || co.Finish() != nil {
		t.Fatal(err, co.Finish())
	}
	return s.(*Source)
}

func read(t *testing.T, s *Source, splits []pipeline.Split, bufN, stop int) ([]string, []pipeline.Split) {
	r, err := s.Open(context.Background(), splits)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]pipeline.SourceRecord, bufN)
	var out []string
	for stop == 0 || len(out) < stop {
		n, err := r.Read(context.Background(), buf[:min(bufN, max(1, stop-len(out)))])
		for _, rec := range buf[:n] {
			if !json.Valid(rec.Value) || !rec.HasTS {
				t.Fatalf("bad record %q", rec.Value)
			}
			out = append(out, string(rec.Value))
		}
		if err == io.EOF {
			break
		}
	}
	return out, r.Positions()
}

// TestDeterministicResume: the records do not depend on batching, and a resumed reader
// continues exactly where the positions say.
func TestDeterministicResume(t *testing.T) {
	for _, kind := range []string{"counter", "nexmark"} {
		s := source(t, map[string]any{"kind": kind, "seed": 3, "splits": 2, "count": 400})
		splits := []pipeline.Split{{ID: "gen-0"}, {ID: "gen-1"}}
		all, _ := read(t, s, splits, 64, 0)
		if len(all) != 800 {
			t.Fatalf("%s: %d records", kind, len(all))
		}
		sortedAll := slices.Sorted(slices.Values(all))
		for _, cut := range []int{1, 77, 799} {
			first, pos := read(t, s, splits, 5, cut)
			rest, _ := read(t, s, pos, 13, 0)
			if got := slices.Sorted(slices.Values(append(first, rest...))); !slices.Equal(got, sortedAll) {
				t.Fatalf("%s cut %d: records differ", kind, cut)
			}
		}
		other := source(t, map[string]any{"kind": kind, "seed": 4, "splits": 2, "count": 400})
		if o, _ := read(t, other, splits, 64, 0); slices.Equal(o, all) {
			t.Fatalf("%s: the seed changes nothing", kind)
		}
	}
}

func TestOptionErrors(t *testing.T) {
	co := pipeline.NewOptions("sources[0]", map[string]any{"kind": "weather", "splits": 0, "rate": -1})
	New(&pipeline.SourceSpec{Name: "g"}, co, &pipeline.Env{})
	err := co.Finish()
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"sources[0].kind", "sources[0].splits", "sources[0].rate"} {
		if !contains(err.Error(), want) {
			t.Errorf("%v lacks %s", err, want)
		}
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}
