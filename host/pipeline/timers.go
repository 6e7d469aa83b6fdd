package pipeline

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"

	"github.com/clink-wasm/clink-wasm/host/state"
)

// Timers across a rescale.
//
// The scheduler keeps a subtask's event-time timers in one operator-state blob,
// "clink.timers". After a restore at another parallelism a new subtask overlaps several old
// subtasks' key groups, and the state tier hands back each of their blobs with its range
// (Tiered.RestoredOperatorState) instead of one. remapTimers merges them, keeping only the
// timers whose key falls in the new subtask's key groups, and stores the result where the
// scheduler reads its timers. The blob format is the scheduler's (host/scheduler/timers.go:
// version byte 1, uvarint count, then per timer uvarint length and 8-byte big-endian time
// followed by the key); it is copied here because the scheduler does not export it.

// Processing-time timers are kept the same way under "clink.ptimers", and remapped alike.
var timerStateNames = []string{"clink.timers", "clink.ptimers"}

func remapTimers(b *state.Tiered) error {
	for _, name := range timerStateNames {
		if err := remapTimerState(b, name); err != nil {
			return err
		}
	}
	return nil
}

func remapTimerState(b *state.Tiered, name string) error {
	blobs := b.RestoredOperatorState(name)
	if len(blobs) == 0 || (len(blobs) == 1 && blobs[0].Range == b.KeyGroups()) {
		return nil // a restore at the same parallelism: the scheduler reads its own blob
	}
	own, numKG := b.KeyGroups(), b.NumKeyGroups()
	var ids []string
	seen := map[string]bool{}
	for _, rb := range blobs {
		entries, err := decodeTimers(rb.Data)
		if err != nil {
			return fmt.Errorf("%s of key groups %v: %w", name, rb.Range, err)
		}
		for _, id := range entries {
			if !own.Contains(state.KeyGroupOf([]byte(id[8:]), numKG)) || seen[id] {
				continue
			}
			seen[id] = true
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	out := []byte{1}
	out = binary.AppendUvarint(out, uint64(len(ids)))
	for _, id := range ids {
		out = binary.AppendUvarint(out, uint64(len(id)))
		out = append(out, id...)
	}
	b.SetOperatorState(name, out)
	return nil
}

func decodeTimers(b []byte) ([]string, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if b[0] != 1 {
		return nil, fmt.Errorf("unknown timer state version %d", b[0])
	}
	b = b[1:]
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return nil, errors.New("truncated timer state")
	}
	b = b[k:]
	ids := make([]string, 0, n)
	for range n {
		l, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < l || l < 8 {
			return nil, errors.New("truncated timer")
		}
		ids = append(ids, string(b[k:k+int(l)]))
		b = b[k+int(l):]
	}
	return ids, nil
}
