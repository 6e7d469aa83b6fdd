package scheduler

import (
	"container/heap"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"

	"github.com/clink-wasm/clink-wasm/host/abi"
)

// timerService keeps the event-time timers of one operator subtask: a set deduplicating
// (key, timestamp) and a min-heap by timestamp for firing. Deletion is lazy: a heap entry fires
// only if it is still in the set. It is runner-only.
type timerService struct {
	set    map[string]struct{} // timerID(key, ts)
	perKey map[string]int
	h      timerHeap
	limit  int
	id     []byte // scratch
}

type timerEntry struct {
	ts  int64
	key string
}

type timerHeap []timerEntry

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if h[i].ts != h[j].ts {
		return h[i].ts < h[j].ts
	}
	return h[i].key < h[j].key
}
func (h timerHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)   { *h = append(*h, x.(timerEntry)) }
func (h *timerHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

func newTimerService(limit int) *timerService {
	return &timerService{set: make(map[string]struct{}), perKey: make(map[string]int), limit: limit}
}

func (ts *timerService) timerID(key []byte, t int64) []byte {
	ts.id = binary.BigEndian.AppendUint64(ts.id[:0], uint64(t))
	return append(ts.id, key...)
}

func (ts *timerService) register(key []byte, t int64) error {
	id := ts.timerID(key, t)
	if _, ok := ts.set[string(id)]; ok {
		return nil
	}
	if ts.perKey[string(key)] >= ts.limit {
		return abi.TooLarge
	}
	ts.set[string(id)] = struct{}{}
	ts.perKey[string(key)]++
	heap.Push(&ts.h, timerEntry{ts: t, key: string(key)})
	return nil
}

func (ts *timerService) remove(key []byte, t int64) {
	id := ts.timerID(key, t)
	if _, ok := ts.set[string(id)]; !ok {
		return
	}
	delete(ts.set, string(id))
	ts.dec(string(key))
}

func (ts *timerService) dec(key string) {
	if n := ts.perKey[key] - 1; n > 0 {
		ts.perKey[key] = n
	} else {
		delete(ts.perKey, key)
	}
}

// popDue removes and returns every live timer at or before wm, in (timestamp, key) order.
func (ts *timerService) popDue(wm int64) []timerEntry {
	var due []timerEntry
	for len(ts.h) > 0 && ts.h[0].ts <= wm {
		e := heap.Pop(&ts.h).(timerEntry)
		id := ts.timerID([]byte(e.key), e.ts)
		if _, ok := ts.set[string(id)]; !ok {
			continue // deleted, or a duplicate entry of a re-registered timer
		}
		delete(ts.set, string(id))
		ts.dec(e.key)
		due = append(due, e)
	}
	return due
}

// hasDue reports whether a live timer is at or before wm.
func (ts *timerService) hasDue(wm int64) bool {
	for len(ts.h) > 0 && ts.h[0].ts <= wm {
		e := ts.h[0]
		if _, ok := ts.set[string(ts.timerID([]byte(e.key), e.ts))]; ok {
			return true
		}
		heap.Pop(&ts.h)
	}
	return false
}

// next returns the time of the earliest live timer.
func (ts *timerService) next() (int64, bool) {
	for len(ts.h) > 0 {
		e := ts.h[0]
		if _, ok := ts.set[string(ts.timerID([]byte(e.key), e.ts))]; ok {
			return e.ts, true
		}
		heap.Pop(&ts.h)
	}
	return 0, false
}

func (ts *timerService) len() int { return len(ts.set) }

// Timers persist as operator state: a version byte, then (ts, key) entries in sorted order.
const timersStateName = "clink.timers"

// Processing-time timers persist the same way, under their own name.
const procTimersStateName = "clink.ptimers"

func (ts *timerService) marshal() []byte {
	ids := make([]string, 0, len(ts.set))
	for id := range ts.set {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	b := []byte{1}
	b = binary.AppendUvarint(b, uint64(len(ids)))
	for _, id := range ids {
		b = binary.AppendUvarint(b, uint64(len(id)))
		b = append(b, id...)
	}
	return b
}

func (ts *timerService) unmarshal(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if b[0] != 1 {
		return fmt.Errorf("timer state: unknown version %d", b[0])
	}
	b = b[1:]
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return errors.New("timer state: truncated")
	}
	b = b[k:]
	for range n {
		l, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < l || l < 8 {
			return errors.New("timer state: truncated entry")
		}
		id := b[k : k+int(l)]
		b = b[k+int(l):]
		t := int64(binary.BigEndian.Uint64(id[:8]))
		key := string(id[8:])
		ts.set[string(id)] = struct{}{}
		ts.perKey[key]++
		heap.Push(&ts.h, timerEntry{ts: t, key: key})
	}
	return nil
}
