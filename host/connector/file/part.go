package file

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// PartWriter stages one sink subtask's output as JSON Lines in Dir: records go to an
// in-progress file, and Stage renames it CHECKPOINT-SUBTASK.part (after an fsync of the file
// and of Dir when Fsync), the durable-but-invisible half of a two-phase commit. The file sink
// and the hosted preview sink both commit such parts.
type PartWriter struct {
	Dir     string
	Subtask int
	Fsync   bool
	BufSize int

	f       *os.File
	bw      *bufio.Writer
	n       int64
	compact bytes.Buffer
}

// Write appends recs, one compact JSON value a line; a value that is not JSON is refused.
func (w *PartWriter) Write(recs []pipeline.SinkRecord) error {
	if w.f == nil {
		var rnd [6]byte
		_, _ = rand.Read(rnd[:])
		f, err := os.Create(filepath.Join(w.Dir, fmt.Sprintf("inprogress-%d-%s", w.Subtask, hex.EncodeToString(rnd[:]))))
		if err != nil {
			return err
		}
		w.f, w.bw, w.n = f, bufio.NewWriterSize(f, max(w.BufSize, 4096)), 0
	}
	for i := range recs {
		v := recs[i].Value
		if !json.Valid(v) {
			return fmt.Errorf("an output is not valid JSON: %.100q", v)
		}
		if bytes.ContainsAny(v, "\r\n") {
			w.compact.Reset()
			_ = json.Compact(&w.compact, v)
			v = w.compact.Bytes()
		}
		w.bw.Write(v)
		if err := w.bw.WriteByte('\n'); err != nil {
			return err
		}
		w.n += int64(len(v)) + 1
	}
	return nil
}

// Stage makes what was written since the last Stage durable as the part of checkpoint and
// returns its name and size; "" when nothing was written.
func (w *PartWriter) Stage(checkpoint uint64) (part string, size int64, err error) {
	if w.f == nil {
		return "", 0, nil
	}
	if err := w.bw.Flush(); err != nil {
		return "", 0, err
	}
	if w.Fsync {
		if err := w.f.Sync(); err != nil {
			return "", 0, err
		}
	}
	if err := w.f.Close(); err != nil {
		return "", 0, err
	}
	part = fmt.Sprintf("%020d-%05d.part", checkpoint, w.Subtask)
	if err := os.Rename(w.f.Name(), filepath.Join(w.Dir, part)); err != nil {
		return "", 0, err
	}
	if w.Fsync {
		if err := syncDir(w.Dir); err != nil {
			return "", 0, err
		}
	}
	size = w.n
	w.f, w.bw = nil, nil
	return part, size, nil
}

// Abandon removes what was written since the last Stage (never pre-committed).
func (w *PartWriter) Abandon() error {
	if w.f == nil {
		return nil
	}
	name := w.f.Name()
	w.f.Close()
	w.f = nil
	return os.Remove(name)
}
