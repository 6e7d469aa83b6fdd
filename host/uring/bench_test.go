//go:build linux

package uring

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

var benchFileMiB = flag.Int("uring.filemib", 256, "size in MiB of the file BenchmarkBlockRead reads (32 with -short)")

const benchBlock = 4096

// benchRounds is the least number of alternating rounds a comparison is split into.
const benchRounds = 10

// comparison is the outcome of interleave.
type comparison struct {
	rateA, rateB float64 // operations per second over all rounds
	ratio        float64 // median over rounds of rate A / rate B
}

// interleave runs total operations on each of a and b (each call performs n and returns the
// time it took), alternating in rounds (ABBA...) so that load from other processes on the
// machine lands on both. The median of the per-round ratios resists a burst that hits one
// round; the overall rates do not, and are reported for scale.
func interleave(total, rounds int, a, b func(n int) time.Duration) comparison {
	per := max((total+rounds-1)/rounds, 1)
	var ta, tb time.Duration
	ratios := make([]float64, rounds)
	for i := range rounds {
		var da, db time.Duration
		if i%2 == 0 {
			da, db = a(per), b(per)
		} else {
			db, da = b(per), a(per)
		}
		ta, tb = ta+da, tb+db
		ratios[i] = db.Seconds() / da.Seconds()
	}
	slices.Sort(ratios)
	med := ratios[rounds/2]
	if rounds%2 == 0 {
		med = (ratios[rounds/2-1] + ratios[rounds/2]) / 2
	}
	n := float64(per * rounds)
	return comparison{rateA: n / ta.Seconds(), rateB: n / tb.Seconds(), ratio: med}
}

// BenchmarkBlockRead compares random 4 KiB block reads through the io_uring BlockReader and
// through the pread pool, in the same run, with 1, 16, 64 and 256 reads outstanding, from a
// page-cache-warm file and from a cold one (posix_fadvise(DONTNEED) before every round).
//
// Each lane keeps one read outstanding and issues its next read from the completion callback,
// as the state tier would chain them. The pool runs one worker per outstanding read (the
// idiomatic "a goroutine per blocking read", and the pool's best case); the ring has as many
// entries. The two backends alternate in rounds (see interleave). Reported: reads/s for each,
// the median per-round ratio, and the batching achieved (SQEs per io_uring_enter, CQEs per
// reap); ns/op counts one read on each backend plus the cache dropping.
func BenchmarkBlockRead(b *testing.B) {
	if err := Available(); err != nil {
		b.Skipf("io_uring unavailable here: %v", err)
	}
	size := int64(*benchFileMiB) << 20
	if testing.Short() {
		size = min(size, 32<<20)
	}
	f := benchFile(b, size)
	fd := int(f.Fd())
	blocks := size / benchBlock

	for _, cold := range []bool{false, true} {
		for _, depth := range []int{1, 16, 64, 256} {
			name := fmt.Sprintf("cache=warm/depth=%d", depth)
			if cold {
				name = fmt.Sprintf("cache=cold/depth=%d", depth)
			}
			b.Run(name, func(b *testing.B) {
				ring, err := NewBlockReader(WithBackend(BackendIOUring), WithEntries(depth))
				if err != nil {
					b.Fatal(err)
				}
				defer ring.Close()
				pool, err := NewBlockReader(WithBackend(BackendPool), WithWorkers(depth))
				if err != nil {
					b.Fatal(err)
				}
				defer pool.Close()

				if cold {
					dropCache(b, f)
				} else {
					warmCache(b, f)
				}
				// Rounds of at most blocks/8 reads, so that a cold round rereads few blocks.
				rounds := max(benchRounds, (b.N+int(blocks/8)-1)/int(blocks/8))
				rng := rand.New(rand.NewPCG(uint64(depth), 1))
				var offs []int64
				resident := -1.0
				reads := func(br BlockReader) func(n int) time.Duration {
					return func(n int) time.Duration {
						if len(offs) != n {
							offs = make([]int64, n)
							for j := range offs {
								offs[j] = rng.Int64N(blocks) * benchBlock
							}
						}
						if cold {
							dropCache(b, f)
							if resident < 0 {
								resident = residentFraction(b, f)
							}
						}
						return chainReads(b, br, fd, depth, offs)
					}
				}
				b.ResetTimer()
				c := interleave(b.N, rounds, reads(ring), reads(pool))
				b.StopTimer()
				if e, ok := ring.(*blockReader).r.e.(*ringEngine); ok {
					b.ReportMetric(float64(e.submitted.Load())/float64(e.enters.Load()), "sqes/enter")
					b.ReportMetric(float64(e.reaped.Load())/float64(e.reaps.Load()), "cqes/reap")
				}
				b.ReportMetric(c.rateA, "uring-reads/s")
				b.ReportMetric(c.rateB, "pread-reads/s")
				b.ReportMetric(c.ratio, "uring/pread")
				if cold {
					b.ReportMetric(100*resident, "resident-%")
				}
			})
		}
	}
}

// chainReads reads the blocks at offs with depth reads outstanding and returns the time taken.
func chainReads(b *testing.B, br BlockReader, fd, depth int, offs []int64) time.Duration {
	bufs := make([][]byte, depth)
	for i := range bufs {
		bufs[i] = make([]byte, benchBlock)
	}
	var next, remaining atomic.Int64
	remaining.Store(int64(len(offs)))
	done := make(chan struct{})
	var failed atomic.Pointer[error]
	var issue func(lane int)
	issue = func(lane int) {
		i := next.Add(1) - 1
		if i >= int64(len(offs)) {
			return
		}
		br.ReadAt(fd, bufs[lane], offs[i], func(n int, err error) {
			if err != nil {
				failed.CompareAndSwap(nil, &err)
			}
			if remaining.Add(-1) == 0 {
				close(done)
				return
			}
			issue(lane)
		})
	}
	start := time.Now()
	for lane := range min(depth, len(offs)) {
		issue(lane)
	}
	<-done
	el := time.Since(start)
	if err := failed.Load(); err != nil {
		b.Fatalf("read: %v", *err)
	}
	return el
}

// BenchmarkNop measures the reactors' own per-operation cost: Do(Nop) from depth goroutines.
func BenchmarkNop(b *testing.B) {
	if err := Available(); err != nil {
		b.Skipf("io_uring unavailable here: %v", err)
	}
	for _, depth := range []int{1, 16} {
		b.Run(fmt.Sprintf("depth=%d", depth), func(b *testing.B) {
			ring := newReactor(b, WithBackend(BackendIOUring), WithEntries(depth))
			pool := newReactor(b, WithBackend(BackendPool), WithWorkers(depth))
			run := func(r *Reactor, n int) time.Duration {
				var next atomic.Int64
				start := time.Now()
				done := make(chan struct{})
				for range depth {
					go func() {
						defer func() { done <- struct{}{} }()
						for next.Add(1) <= int64(n) {
							if _, err := r.Do(context.Background(), Nop()); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				for range depth {
					<-done
				}
				return time.Since(start)
			}
			b.ResetTimer()
			c := interleave(b.N, benchRounds, func(n int) time.Duration { return run(ring, n) },
				func(n int) time.Duration { return run(pool, n) })
			b.ReportMetric(c.rateA, "uring-ops/s")
			b.ReportMetric(c.rateB, "pool-ops/s")
			b.ReportMetric(c.ratio, "uring/pool")
		})
	}
}

// benchFile creates a file of size random bytes, durably written so that its pages are clean
// and posix_fadvise(DONTNEED) can drop them.
func benchFile(b *testing.B, size int64) *os.File {
	b.Helper()
	path := filepath.Join(b.TempDir(), "blocks")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	chunk := make([]byte, 1<<20)
	rng := rand.NewChaCha8([32]byte{2})
	for written := int64(0); written < size; written += int64(len(chunk)) {
		_, _ = rng.Read(chunk)
		if _, err := f.Write(chunk); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	return f
}

func dropCache(b *testing.B, f *os.File) {
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		b.Fatalf("posix_fadvise(DONTNEED): %v", err)
	}
}

func warmCache(b *testing.B, f *os.File) {
	buf := make([]byte, 1<<20)
	for off := int64(0); ; off += int64(len(buf)) {
		n, err := f.ReadAt(buf, off)
		if n == 0 || err != nil {
			return
		}
	}
}

// residentFraction is the share of f's pages in the page cache (mincore over a mapping), to
// show that the cold rounds are cold.
func residentFraction(b *testing.B, f *os.File) float64 {
	st, err := f.Stat()
	if err != nil {
		b.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(m)
	pages := (len(m) + os.Getpagesize() - 1) / os.Getpagesize()
	vec := make([]byte, pages)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)),
		uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		b.Fatalf("mincore: %v", errno)
	}
	in := 0
	for _, v := range vec {
		in += int(v & 1)
	}
	return float64(in) / float64(pages)
}
