package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/clink-wasm/clink-wasm/host/connector/file"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// # The preview sink
//
// A hosted pipeline's preview sink keeps its latest committed outputs, exactly once, in a
// bounded space: generations of JSON Lines files dir/NAME.GGGGGG.jsonl. Each sink subtask writes
// a checkpoint interval's records to a part file in dir/.NAME.pending and pre-commits it on the
// barrier (fsynced, invisible); once the checkpoint record is durable the committer appends the
// parts, in subtask order, to the current generation. A checkpoint prepared when the current
// generation has reached max_bytes starts the next generation instead, and committing it
// deletes every generation but the two newest. On disk the preview therefore holds at most
// 2 × max_bytes plus one checkpoint interval's output (and the pending parts of the interval
// being written).
//
// The checkpoint record holds the generation and its length before and after (base, end), so a
// commit is idempotent (a file of length end is committed; of a length in [base, end) it is
// truncated to base and appended again) and recovery is exact: it re-commits the restored
// checkpoint, deletes newer generations, truncates the restored one to its end and deletes the
// part files.

const (
	// DefaultPreviewBytes is a generation's size when the spec sets no max_bytes.
	DefaultPreviewBytes = 4 << 20
	// MaxPreviewBytes is the largest max_bytes a spec may set.
	MaxPreviewBytes = 64 << 20
	keepGenerations = 2
)

type previewSink struct {
	dir, name string
	pending   string
	maxBytes  int64
	fsync     bool
	observe   func(sink string, n int) // RegisterObserved's; nil for none

	mu  sync.Mutex
	gen int   // the generation last committed
	end int64 // its committed length
}

func newPreviewSink(dir string, spec *pipeline.SinkSpec, o *pipeline.ConnectorOptions) (*previewSink, error) {
	maxBytes := o.Int("max_bytes", DefaultPreviewBytes)
	if maxBytes < 1024 || maxBytes > MaxPreviewBytes {
		o.Fail("max_bytes", "must be between 1024 and %d (a preview keeps the latest outputs, not all of them), got %d", MaxPreviewBytes, maxBytes)
	}
	if dir == "" {
		return nil, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return &previewSink{dir: dir, name: spec.Name, pending: filepath.Join(dir, "."+spec.Name+".pending"), maxBytes: int64(maxBytes), fsync: true}, nil
}

// generationPath is generation gen of sink name's preview under dir.
func generationPath(dir, name string, gen int) string {
	return filepath.Join(dir, fmt.Sprintf("%s.%06d.jsonl", name, gen))
}

// generations lists the generations of sink name's preview under dir, oldest first.
func generations(dir, name string) ([]int, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var gens []int
	for _, e := range ents {
		mid, ok := strings.CutPrefix(e.Name(), name+".")
		if !ok {
			continue
		}
		mid, ok = strings.CutSuffix(mid, ".jsonl")
		if !ok || len(mid) < 6 || strings.Trim(mid, "0123456789") != "" {
			continue
		}
		g, err := strconv.Atoi(mid)
		if err == nil {
			gens = append(gens, g)
		}
	}
	slices.Sort(gens)
	return gens, nil
}

func (s *previewSink) Committer() pipeline.SinkCommitter { return s }

func (s *previewSink) Open(ctx context.Context, sc pipeline.SinkContext) (pipeline.SinkWriter, error) {
	if err := os.MkdirAll(s.pending, 0o755); err != nil {
		return nil, err
	}
	return &previewWriter{pw: file.PartWriter{Dir: s.pending, Subtask: sc.Subtask, Fsync: s.fsync, BufSize: 64 << 10}, name: s.name, observe: s.observe}, nil
}

// previewPrepared is the committer's part of a checkpoint record: the generation file the
// checkpoint's parts go to, and the file sink's Parts within it.
type previewPrepared struct {
	Gen int `json:"gen"`
	file.Parts
}

func (s *previewSink) Prepare(ctx context.Context, checkpoint uint64, handles [][]byte) ([]byte, error) {
	s.mu.Lock()
	gen, base := s.gen, s.end
	s.mu.Unlock()
	parts, err := file.GatherParts(base, handles)
	if err != nil {
		return nil, err
	}
	p := previewPrepared{Gen: gen, Parts: parts}
	if p.Base >= s.maxBytes && len(p.Parts.Parts) > 0 {
		p.Gen, p.End, p.Base = p.Gen+1, p.End-p.Base, 0 // rotate: this checkpoint starts the next generation
	}
	return json.Marshal(p)
}

func (s *previewSink) Commit(ctx context.Context, checkpoint uint64, prep []byte) error {
	var p previewPrepared
	if err := json.Unmarshal(prep, &p); err != nil {
		return fmt.Errorf("bad prepared state: %w", err)
	}
	if err := s.commit(&p); err != nil {
		return err
	}
	s.mu.Lock()
	s.gen, s.end = p.Gen, p.End
	s.mu.Unlock()
	return s.dropOld(p.Gen)
}

// dropOld deletes the generations older than the keepGenerations newest up to gen, and any
// newer than gen (uncommitted: left by a crash before a restore).
func (s *previewSink) dropOld(gen int) error {
	gens, err := generations(s.dir, s.name)
	if err != nil {
		return err
	}
	for _, g := range gens {
		if g <= gen-keepGenerations || g > gen {
			if err := os.Remove(generationPath(s.dir, s.name, g)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}

func (s *previewSink) commit(p *previewPrepared) error {
	return file.CommitParts(generationPath(s.dir, s.name, p.Gen), s.pending, p.Parts, s.fsync)
}

func (s *previewSink) Recover(ctx context.Context, checkpoint uint64, prep []byte) error {
	// A preview written before generations existed was one file, NAME.jsonl, which checkpoint
	// records of that time describe as generation 0.
	legacy, g0 := filepath.Join(s.dir, s.name+".jsonl"), generationPath(s.dir, s.name, 0)
	if _, err := os.Stat(legacy); err == nil {
		if _, err := os.Stat(g0); errors.Is(err, os.ErrNotExist) {
			if err := os.Rename(legacy, g0); err != nil {
				return err
			}
		}
	}
	var p previewPrepared
	if prep != nil {
		if err := json.Unmarshal(prep, &p); err != nil {
			return fmt.Errorf("bad prepared state: %w", err)
		}
		if st, err := os.Stat(generationPath(s.dir, s.name, p.Gen)); (err != nil && errors.Is(err, os.ErrNotExist)) || (err == nil && st.Size() < p.Base) {
			// The preview is gone (a run directory lost with its disk, the state restored from
			// the object store): it is a view, not the system of record, so it starts again
			// empty, in a new generation, rather than failing the restore.
			p = previewPrepared{Gen: p.Gen + 1}
		} else if err := s.commit(&p); err != nil {
			return err
		}
	}
	// Everything after the restored checkpoint is uncommitted: newer generations go, the
	// restored one is cut at its end, the parts are deleted.
	if err := s.dropOld(p.Gen); err != nil {
		return err
	}
	if err := file.DiscardAfter(generationPath(s.dir, s.name, p.Gen), s.pending, p.End, s.fsync); err != nil {
		return err
	}
	s.mu.Lock()
	s.gen, s.end = p.Gen, p.End
	s.mu.Unlock()
	return nil
}

type previewWriter struct {
	pw      file.PartWriter
	name    string
	observe func(sink string, n int)
}

func (w *previewWriter) Write(ctx context.Context, recs []pipeline.SinkRecord) error {
	if err := w.pw.Write(recs); err != nil {
		return err
	}
	if w.observe != nil {
		w.observe(w.name, len(recs))
	}
	return nil
}

func (w *previewWriter) PreCommit(ctx context.Context, checkpoint uint64) ([]byte, error) {
	return w.pw.PreCommit(checkpoint)
}

func (w *previewWriter) Close(ctx context.Context) error { return w.pw.Abandon() }

// Cursor is a reader's place in a preview: a generation and an offset in it.
type Cursor struct {
	Gen int
	Off int64
}

// TailPreview returns the last n committed lines of sink name's preview under dir (from the two
// newest generations, reading at most maxBytes of each) and the cursor after them.
func TailPreview(dir, name string, n int, maxBytes int64) ([][]byte, Cursor, error) {
	gens, err := generations(dir, name)
	if err != nil || len(gens) == 0 {
		return nil, Cursor{}, err
	}
	newest := gens[len(gens)-1]
	lines, off, err := Tail(generationPath(dir, name, newest), n, maxBytes)
	if err != nil {
		return nil, Cursor{}, err
	}
	if len(lines) < n && len(gens) > 1 {
		older, _, err := Tail(generationPath(dir, name, gens[len(gens)-2]), n-len(lines), maxBytes)
		if err != nil {
			return nil, Cursor{}, err
		}
		lines = append(older, lines...)
	}
	return lines, Cursor{Gen: newest, Off: off}, nil
}

// FollowPreview returns the lines committed after c (up to maxBytes) and the cursor after them.
// A reader that fell behind by more than the generations kept skips to the oldest one kept; a
// preview cut back by a restore starts again at its restored end.
func FollowPreview(dir, name string, c Cursor, maxBytes int64) ([][]byte, Cursor, error) {
	gens, err := generations(dir, name)
	if err != nil || len(gens) == 0 {
		return nil, c, err
	}
	if !slices.Contains(gens, c.Gen) {
		i, _ := slices.BinarySearch(gens, c.Gen)
		if i == len(gens) { // restored to an older generation
			i = len(gens) - 1
		}
		c = Cursor{Gen: gens[i]}
	}
	lines, next, _, err := ReadFrom(generationPath(dir, name, c.Gen), c.Off, maxBytes)
	if err != nil {
		return nil, c, err
	}
	c.Off = next
	if len(lines) == 0 {
		if i := slices.Index(gens, c.Gen); i >= 0 && i+1 < len(gens) {
			return FollowPreview(dir, name, Cursor{Gen: gens[i+1]}, maxBytes)
		}
	}
	return lines, c, nil
}
