package state

import (
	"sort"
	"sync"
	"sync/atomic"
)

// The global hot budget is shared max-min fairly in three levels: tenants, then the operators
// of a tenant, then the subtasks of an operator. Within a level, members using less than their
// fair share keep what they use (plus headroom to grow) and the slack goes to the members that
// want more, split evenly (water-filling). A backend with a per-operator override gets exactly
// its override, taken off the top. The runner reads its limit with one atomic load; the Store
// recomputes limits when a backend joins or leaves and periodically from observed usage.

type budgetMember struct {
	tenant, op string
	fixed      int64        // per-operator override; 0 = share of the global budget
	usage      atomic.Int64 // hot bytes, published by the runner
	limit      atomic.Int64 // current limit, read by the runner; 0 = unbounded
}

type budget struct {
	total int64 // 0 = unbounded
	mu    sync.Mutex
	ms    map[*budgetMember]struct{}
}

func newBudget(total int64) *budget {
	return &budget{total: total, ms: map[*budgetMember]struct{}{}}
}

func (b *budget) join(m *budgetMember) {
	b.mu.Lock()
	b.ms[m] = struct{}{}
	b.mu.Unlock()
	b.rebalance()
}

func (b *budget) leave(m *budgetMember) {
	b.mu.Lock()
	delete(b.ms, m)
	b.mu.Unlock()
	b.rebalance()
}

// demandOf estimates what a member wants: a member near its limit may want more than it has
// (unbounded demand); one well under its limit wants what it uses plus headroom to grow.
func demandOf(m *budgetMember) int64 {
	u, l := m.usage.Load(), m.limit.Load()
	if l == 0 || u >= l-l/8 {
		return -1 // unbounded
	}
	return u + u/4 + 1<<20
}

func (b *budget) rebalance() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.total == 0 {
		for m := range b.ms {
			if m.fixed > 0 {
				m.limit.Store(m.fixed)
			} else {
				m.limit.Store(0)
			}
		}
		return
	}
	avail := b.total
	tenants := map[string]map[string][]*budgetMember{}
	for m := range b.ms {
		if m.fixed > 0 {
			m.limit.Store(m.fixed)
			avail -= m.fixed
			continue
		}
		if tenants[m.tenant] == nil {
			tenants[m.tenant] = map[string][]*budgetMember{}
		}
		tenants[m.tenant][m.op] = append(tenants[m.tenant][m.op], m)
	}
	avail = max(avail, 0) // limits are floored at 1 byte below: never 0, which means unbounded
	// Demands per level: a group's demand is the sum of its members' (unbounded if any is).
	type node struct {
		demand int64
		apply  func(int64)
	}
	sum := func(ds []int64) int64 {
		var s int64
		for _, d := range ds {
			if d < 0 {
				return -1
			}
			s += d
		}
		return s
	}
	var tnodes []node
	for _, ops := range tenants {
		var onodes []node
		var odem []int64
		for _, subs := range ops {
			var sdem []int64
			for _, m := range subs {
				sdem = append(sdem, demandOf(m))
			}
			subs, sdem := subs, sdem
			onodes = append(onodes, node{demand: sum(sdem), apply: func(c int64) {
				for i, share := range waterFill(c, sdem) {
					subs[i].limit.Store(max(share, 1))
				}
			}})
			odem = append(odem, sum(sdem))
		}
		tnodes = append(tnodes, node{demand: sum(odem), apply: func(c int64) {
			for i, share := range waterFill(c, odem) {
				onodes[i].apply(share)
			}
		}})
	}
	tdem := make([]int64, len(tnodes))
	for i, n := range tnodes {
		tdem[i] = n.demand
	}
	for i, share := range waterFill(avail, tdem) {
		tnodes[i].apply(share)
	}
}

// waterFill splits capacity max-min fairly among demands (-1 = unbounded). Members whose demand
// is below the fair share get their demand; the rest is split evenly among the others. Any
// capacity left when every demand is met is split evenly among all, so limits always sum to
// capacity.
func waterFill(capacity int64, demands []int64) []int64 {
	n := len(demands)
	out := make([]int64, n)
	if n == 0 {
		return out
	}
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool {
		da, db := demands[idx[a]], demands[idx[b]]
		if da < 0 {
			return false
		}
		if db < 0 {
			return true
		}
		return da < db
	})
	left := capacity
	for k, i := range idx {
		fair := left / int64(n-k)
		if d := demands[i]; d >= 0 && d <= fair {
			out[i] = d
			left -= d
			continue
		}
		for _, j := range idx[k:] { // everyone from here on wants at least the fair share
			out[j] = left / int64(n-k)
		}
		return out
	}
	// Every demand met: spread the remainder so limits add up to the capacity.
	for i := range out {
		out[i] += left / int64(n)
	}
	return out
}
