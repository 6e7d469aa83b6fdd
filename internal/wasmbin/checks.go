package wasmbin

import (
	"cmp"
	"slices"
)

// Which function bodies keep their entry check.
//
// Every loop header has a check, so a run of guest code without checks can only be unbounded
// (or merely very long) through calls: a cycle of calls, or a call graph that is acyclic but
// shares callees, so that f calls g twice, g calls h twice, and so on, doubling the work at
// every level. A function body keeps its entry check when one of these holds:
//
//   - it is part of a cycle of direct calls (call, return_call), itself included: every
//     cycle of direct calls then passes a check;
//   - it can be entered other than by a direct call (it is exported, in an element segment or
//     named by ref.func, so that a call_indirect, a call_ref or the host can call it) and it
//     can itself reach, through direct calls, an indirect call or a call to an import. A cycle
//     that goes through an indirect call or through the host (an import that calls an export
//     back) enters such a function, so it passes a check too. A function that can reach
//     neither cannot be part of such a cycle, whoever calls it;
//   - the work it can do without a check, its cost, would exceed maxUncheckedCost (see below).
//
// Every other function, leaves (no loop, no call) included, runs without an entry check. The
// cost of a function without one is the size of its body in bytes plus, for every direct call
// in it, the cost of the callee when the callee has no entry check either (a callee with one
// ends the run). Callees come before callers (the call graph without its cycles is acyclic),
// and when a caller's cost would exceed the bound, its callees with the largest share of it
// get their entry checks back first; only when that is not enough does the caller keep its
// own. So a run between two checks executes at most about maxUncheckedCost bytes of code (or
// one body, if a single body is larger), plus what the frames it returns through still run
// after their calls, which the stack's depth bounds.
//
// Sizes in bytes are a bound, not a measure: a loop's body counts once, since its header is a
// check, and a branch's arms count both.

// maxUncheckedCost bounds the bytes of code a run between two checks can execute (see above):
// 16 KiB, a few microseconds of straight-line code. It is not a time budget (one loop
// iteration can take far longer), only what keeps the call graph from multiplying it.
const maxUncheckedCost = 16 << 10

// funcInfo is what entryChecks needs of one defined function body.
type funcInfo struct {
	start, end int    // the rewritten body, with its entry check, in module.bodyBuf
	check      int    // where the entry check starts, from start
	size       int    // of the input body, the cost of its own code
	calls      [2]int // its direct calls of defined functions, one per call site, in module.callees
	// reenters is set when the body makes an indirect call (call_indirect, call_ref, their
	// tail forms) or calls an import.
	reenters bool
}

// takeAddr records that function idx (an input index) can be called other than directly.
func (m *module) takeAddr(idx uint32) {
	if m.scanning || idx < m.nImportFuncs || idx-m.nImportFuncs >= m.nFuncs {
		return
	}
	if m.addrTaken == nil {
		m.addrTaken = make([]bool, m.nFuncs)
	}
	m.addrTaken[idx-m.nImportFuncs] = true
}

// call records a direct call (call or return_call) of function idx by the body being rewritten.
func (m *module) call(idx uint32) {
	if idx < m.nImportFuncs {
		m.fn.reenters = true
		return
	}
	// An index past the defined functions is an invalid module, which wazero rejects.
	if idx-m.nImportFuncs < m.nFuncs {
		m.callees = append(m.callees, idx-m.nImportFuncs)
	}
}

// entryChecks reports, per defined function, whether its body keeps its entry check (see the
// comment at the top of this file).
func (m *module) entryChecks() []bool {
	n := len(m.funcs)
	checked := make([]bool, n)
	cost := make([]int, n)
	reaches := make([]bool, n) // an indirect call or an import, through direct calls
	for _, scc := range m.components() {
		// components lists callees' components before their callers'.
		cyclic := len(scc) > 1 || slices.Contains(m.calls(scc[0]), scc[0])
		reach := false
		for _, f := range scc {
			reach = reach || m.funcs[f].reenters
			for _, g := range m.calls(f) {
				reach = reach || reaches[g]
			}
		}
		for _, f := range scc {
			reaches[f] = reach
			if cyclic || (reach && m.addrTaken != nil && m.addrTaken[f]) {
				checked[f] = true
			}
		}
		// A checked function's run after its check is bounded the same way.
		for _, f := range scc {
			cost[f] = m.boundCost(f, checked, cost)
			if cost[f] > maxUncheckedCost {
				checked[f] = true
			}
		}
	}
	return checked
}

// boundCost returns the cost of f without an entry check, after giving its costliest unchecked
// callees their entry checks back until it is within maxUncheckedCost, if it can be.
func (m *module) boundCost(f uint32, checked []bool, cost []int) int {
	total := m.funcs[f].size
	calls := m.calls(f)
	for _, g := range calls {
		if !checked[g] {
			total += cost[g]
		}
	}
	if total <= maxUncheckedCost {
		return total
	}
	// share[g] is what the calls of g add to f's cost.
	share := map[uint32]int{}
	for _, g := range calls {
		if !checked[g] {
			share[g] += cost[g]
		}
	}
	heavy := make([]uint32, 0, len(share))
	for g := range share {
		heavy = append(heavy, g)
	}
	slices.SortFunc(heavy, func(a, b uint32) int {
		return cmp.Or(cmp.Compare(share[b], share[a]), cmp.Compare(a, b))
	})
	for _, g := range heavy {
		if total <= maxUncheckedCost {
			break
		}
		checked[g] = true
		total -= share[g]
	}
	return total
}

// calls returns the direct calls of defined functions made by f, one per call site.
func (m *module) calls(f uint32) []uint32 {
	c := m.funcs[f].calls
	return m.callees[c[0]:c[1]]
}

// components returns the strongly connected components of the graph of direct calls between
// defined functions, callees' components before their callers' (Tarjan's algorithm, without
// recursion: a module can have deep call chains).
func (m *module) components() [][]uint32 {
	n := len(m.funcs)
	const unvisited = -1
	index := make([]int, n)
	low := make([]int, n)
	onStack := make([]bool, n)
	for i := range index {
		index[i] = unvisited
	}
	var sccs [][]uint32
	var stack []uint32
	type frame struct {
		f    uint32
		next int // the next call of f to follow
	}
	var path []frame
	next := 0
	for root := range n {
		if index[root] != unvisited {
			continue
		}
		path = append(path, frame{f: uint32(root)})
		index[root], low[root] = next, next
		next++
		stack = append(stack, uint32(root))
		onStack[root] = true
		for len(path) > 0 {
			top := &path[len(path)-1]
			f := top.f
			if calls := m.calls(f); top.next < len(calls) {
				g := calls[top.next]
				top.next++
				switch {
				case index[g] == unvisited:
					index[g], low[g] = next, next
					next++
					stack = append(stack, g)
					onStack[g] = true
					path = append(path, frame{f: g})
				case onStack[g]:
					low[f] = min(low[f], index[g])
				}
				continue
			}
			path = path[:len(path)-1]
			if len(path) > 0 {
				p := path[len(path)-1].f
				low[p] = min(low[p], low[f])
			}
			if low[f] == index[f] {
				i := len(stack) - 1
				for stack[i] != f {
					i--
				}
				scc := slices.Clone(stack[i:])
				for _, g := range scc {
					onStack[g] = false
				}
				stack = stack[:i]
				sccs = append(sccs, scc)
			}
		}
	}
	return sccs
}
