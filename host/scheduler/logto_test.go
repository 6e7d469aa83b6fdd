package scheduler

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/abi"
)

func TestWriterLog(t *testing.T) {
	if WriterLog(nil, nil) != nil {
		t.Fatal("a nil writer must give a nil LogFunc (lines dropped)")
	}
	var buf bytes.Buffer
	log := WriterLog(&buf, func(pos int64) string { return fmt.Sprintf("line %d", pos+1) })
	log("count", abi.LevelWarn, []byte("slow"), &Source{Pos: 41})
	log("count", abi.LevelInfo, []byte("fired"), &Source{Timer: true, TS: 7})
	log("count", abi.LevelError, []byte("open"), nil)
	want := "[count] warn: slow (line 42)\n[count] info: fired (timer at 7)\n[count] error: open\n"
	if buf.String() != want {
		t.Fatalf("got\n%q\nwant\n%q", buf.String(), want)
	}
}
