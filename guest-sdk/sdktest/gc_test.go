package sdktest

import (
	"fmt"
	"testing"
)

// TestASCollects checks the AssemblyScript SDK's garbage-collection policy (minimal runtime,
// collection at export boundaries): the conformance module allocates strings for every record
// (it decodes the command), yet 50,000 records leave linear memory where it was.
func TestASCollects(t *testing.T) {
	in := load(t, "../testdata/conformance/conformance-as.wasm")
	var pages uint32
	for i := range 50_000 {
		key := fmt.Sprintf("key-%d", i%100)
		if _, err := in.process(key, fmt.Sprintf("put e%d=%0200d", i%10, i), 0); err != nil {
			t.Fatal(err)
		}
		if i == 1000 {
			pages = uint32(in.in.MemoryBytes() / 65536)
		}
	}
	if got := uint32(in.in.MemoryBytes() / 65536); got > pages {
		t.Errorf("linear memory grew from %d pages (after 1,000 records) to %d (after 50,000)", pages, got)
	}
	t.Logf("linear memory: %d pages", pages)
}
