package scheduler

import (
	"os"
	rtmetrics "runtime/metrics"
	"strconv"
	"strings"
)

// heapAllocated is the bytes allocated on the heap so far (cumulative, never decreasing).
func heapAllocated() int64 {
	s := []rtmetrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	rtmetrics.Read(s)
	if s[0].Value.Kind() != rtmetrics.KindUint64 {
		return 0
	}
	return int64(s[0].Value.Uint64())
}

// systemMemory is the memory this process may use: the machine's, or its cgroup's limit if
// that is lower. 16 GiB when neither can be read.
func systemMemory() int64 {
	total := int64(16 << 30)
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				f := strings.Fields(rest)
				if len(f) >= 1 {
					if kb, err := strconv.ParseInt(f[0], 10, 64); err == nil && kb > 0 {
						total = kb << 10
					}
				}
			}
		}
	}
	for _, p := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		if b, err := os.ReadFile(p); err == nil {
			if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && n > 0 {
				total = min(total, n)
			}
		}
	}
	return total
}
