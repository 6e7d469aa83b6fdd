package state

import "github.com/clink-wasm/clink-wasm/internal/objstore"

// memPool is a mem:// pool seen as the backends see it, plus corruption (tests).
type memPool struct {
	metered
	mem *objstore.Mem
}

// openMemStore opens the process-wide mem:// pool called name, as a Store over mem://name does.
func openMemStore(name string) memPool {
	m := objstore.OpenMem(name)
	return memPool{metered: metered{st: m, m: &remoteMetrics{}}, mem: m}
}

// corrupt flips a byte of an object.
func (p memPool) corrupt(name string, off int) bool { return p.mem.Corrupt(name, off) }
