package file

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
	"github.com/clink-wasm/clink-wasm/internal/jsonfield"
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
		if !jsonfield.Valid(v) {
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

// Handle is a sink subtask's pre-commit of one checkpoint: its staged part file and the part's
// size (Part is "" when the subtask wrote nothing).
type Handle struct {
	Part  string `json:"part,omitempty"`
	Bytes int64  `json:"bytes"`
}

// PreCommit stages what was written since the last one (Stage) and encodes its Handle.
func (w *PartWriter) PreCommit(checkpoint uint64) ([]byte, error) {
	part, n, err := w.Stage(checkpoint)
	if err != nil {
		return nil, err
	}
	return json.Marshal(Handle{Part: part, Bytes: n})
}

// Parts is the committer's part of a checkpoint record for one output file: its committed
// length before (Base) and after (End) the checkpoint's parts, appended in subtask order.
type Parts struct {
	Base  int64    `json:"base"`
	End   int64    `json:"end"`
	Parts []string `json:"parts,omitempty"`
}

// GatherParts decodes the subtasks' handles of one checkpoint into the Parts appended to an
// output whose committed length is base.
func GatherParts(base int64, handles [][]byte) (Parts, error) {
	p := Parts{Base: base, End: base}
	for i, hb := range handles {
		var h Handle
		if err := json.Unmarshal(hb, &h); err != nil {
			return Parts{}, fmt.Errorf("subtask %d's handle: %w", i, err)
		}
		if h.Part != "" {
			p.Parts = append(p.Parts, h.Part)
			p.End += h.Bytes
		}
	}
	return p, nil
}

// CommitParts appends p's part files, from the directory pending, to the output at path,
// idempotently: an output of length p.End is committed already; one of a length in
// [p.Base, p.End) is cut back to p.Base and appended again; a shorter one was changed by
// something else and is an error. The part files are deleted once the output holds them.
func CommitParts(path, pending string, p Parts, fsync bool) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if size := st.Size(); size < p.Base {
		return fmt.Errorf("%s is %d bytes, shorter than its committed %d: was it changed by something else?", path, size, p.Base)
	} else if size != p.End {
		if err := f.Truncate(p.Base); err != nil {
			return err
		}
		if _, err := f.Seek(p.Base, io.SeekStart); err != nil {
			return err
		}
		for _, part := range p.Parts {
			pf, err := os.Open(filepath.Join(pending, part))
			if err != nil {
				return fmt.Errorf("committing: part %s: %w", part, err)
			}
			_, err = io.Copy(f, pf)
			pf.Close()
			if err != nil {
				return err
			}
		}
		if fsync {
			if err := f.Sync(); err != nil {
				return err
			}
		}
		if st, err := f.Stat(); err != nil {
			return err
		} else if st.Size() != p.End {
			return fmt.Errorf("committed %s is %d bytes, expected %d", path, st.Size(), p.End)
		}
	}
	for _, part := range p.Parts {
		if err := os.Remove(filepath.Join(pending, part)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// DiscardAfter makes end the output's committed length, for a restore: everything after it,
// and every part file and in-progress file in pending, is uncommitted and goes.
func DiscardAfter(path, pending string, end int64, fsync bool) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	err = f.Truncate(end)
	if err == nil && fsync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	ents, err := os.ReadDir(pending)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".part") || strings.HasPrefix(e.Name(), "inprogress-") {
			if err := os.Remove(filepath.Join(pending, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}
