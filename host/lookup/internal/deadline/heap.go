// Package deadline is an indexed min-heap: the one timer structure of the transports that
// serve many exchanges from one goroutine or one connection (internal/h1's Loop and
// internal/h2's connections). Push, Pop and Remove are O(log n) and allocate nothing beyond
// the heap's slice; each item keeps its own position, so an exchange that ends early leaves
// the heap without a search.
package deadline

// Item is what a Heap holds: usually a pointer to an exchange.
type Item[T any] interface {
	// Before reports whether the item's deadline is earlier than o's.
	Before(o T) bool
	// SetIndex records the item's position in the heap; -1 when it leaves.
	SetIndex(i int)
	// Index returns what SetIndex recorded last.
	Index() int
}

// Heap is a min-heap of items by deadline. The zero Heap is empty and ready to use.
type Heap[T Item[T]] struct {
	items []T
}

// Len returns the number of items.
func (h *Heap[T]) Len() int { return len(h.items) }

// Min returns the item with the earliest deadline. The heap must not be empty.
func (h *Heap[T]) Min() T { return h.items[0] }

// Push adds x.
func (h *Heap[T]) Push(x T) {
	x.SetIndex(len(h.items))
	h.items = append(h.items, x)
	h.up(len(h.items) - 1)
}

// Pop removes and returns the item with the earliest deadline. The heap must not be empty.
func (h *Heap[T]) Pop() T {
	x := h.items[0]
	h.Remove(x)
	return x
}

// Remove takes x out of the heap; an item not in it (Index < 0) is left alone.
func (h *Heap[T]) Remove(x T) {
	i := x.Index()
	if i < 0 || i >= len(h.items) {
		return
	}
	n := len(h.items) - 1
	if i != n {
		h.swap(i, n)
		if !h.down(i, n) {
			h.up(i)
		}
	}
	var zero T
	h.items[n] = zero
	h.items = h.items[:n]
	x.SetIndex(-1)
}

// Clear empties the heap, marking every item as out of it.
func (h *Heap[T]) Clear() {
	var zero T
	for i, x := range h.items {
		x.SetIndex(-1)
		h.items[i] = zero
	}
	h.items = h.items[:0]
}

func (h *Heap[T]) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].SetIndex(i)
	h.items[j].SetIndex(j)
}

func (h *Heap[T]) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !h.items[j].Before(h.items[i]) {
			break
		}
		h.swap(i, j)
		j = i
	}
}

// down sifts the item at i0 down within items[:n]; it reports whether it moved.
func (h *Heap[T]) down(i0, n int) bool {
	i := i0
	for {
		l := 2*i + 1
		if l >= n || l < 0 {
			break
		}
		j := l
		if r := l + 1; r < n && h.items[r].Before(h.items[l]) {
			j = r
		}
		if !h.items[j].Before(h.items[i]) {
			break
		}
		h.swap(i, j)
		i = j
	}
	return i > i0
}
