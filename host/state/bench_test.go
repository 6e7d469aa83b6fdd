package state

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Benchmarks report the targets as metrics; run them together so ratios come from
// one run on the same (noisy, shared) machine:
//
//	go test -run '^$' -bench . -benchtime 1x ./host/state/
//
// S3 variants need eval "$(scripts/s3-up.sh)" first and are skipped otherwise.

func recKey(i int) []byte { return binary.BigEndian.AppendUint64([]byte("user"), uint64(i)) }

// BenchmarkBudget: state 10x the hot budget. Reports the most the tier ever held above its
// budget outside dirty/pinned overflow (target: at most one entry) and the overflow itself.
func BenchmarkBudget(b *testing.B) {
	const budget = 1 << 20
	s := openTest(b, "mem://", WithHotBytes(budget))
	be := operator(b, s, OperatorOptions{Name: "budget"})
	val := make([]byte, 200)
	n := 10 * budget / (len(val) + entryOverhead + 16)
	var maxExcess, maxOverflow, maxEntry int64
	observe := func() {
		m := be.Metrics()
		maxExcess = max(maxExcess, m.HotBytes-m.HotOverflow-m.HotLimit)
		maxOverflow = max(maxOverflow, m.HotOverflow)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	b.ResetTimer()
	for range b.N {
		for i := range n {
			be.Put(Key{Record: recKey(i)}, val)
			if i%1024 == 0 {
				observe()
			}
		}
		checkpoint(b, be, uint64(be.run.captureSeq+1))
		for range 20000 {
			k := Key{Record: recKey(rng.IntN(n))}
			if _, _, hot := be.Get(k); !hot {
				f, err := fetchSync(b, be, []Key{k})
				if err != nil {
					b.Fatal(err)
				}
				be.Fill(f)
			}
			if rng.IntN(4) == 0 {
				be.Put(k, val[:rng.IntN(len(val))])
			}
			observe()
		}
	}
	maxEntry = int64(len(val) + entryOverhead + 16)
	b.ReportMetric(float64(maxExcess), "excess-bytes")
	b.ReportMetric(float64(maxEntry), "entry-bytes")
	b.ReportMetric(float64(maxOverflow), "dirty-overflow-bytes")
	b.ReportMetric(float64(n*(len(val)+entryOverhead+12))/budget, "state/budget")
	if maxExcess > maxEntry {
		b.Errorf("hot tier exceeded its budget by %d bytes (> one entry, %d)", maxExcess, maxEntry)
	}
}

// BenchmarkCheckpointEconomy: bytes written per byte of dirty keys (target <= 1.3) and PUTs per
// checkpoint (target O(segments)).
func BenchmarkCheckpointEconomy(b *testing.B) {
	for _, shape := range []struct {
		keys, value int
		random      bool
	}{{10_000, 100, false}, {100_000, 100, false}, {100_000, 16, false}, {100_000, 32, true}, {20_000, 1000, true}} {
		b.Run(fmt.Sprintf("keys=%d/value=%d/random=%v", shape.keys, shape.value, shape.random), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			s := openTest(b, "mem://", WithHotBytes(0))
			be := operator(b, s, OperatorOptions{Name: "econ"})
			val := make([]byte, shape.value)
			var dirty, written, puts, segs int64
			for it := range b.N {
				dirty = 0
				for i := range shape.keys {
					k := Key{State: StateID(i % 2), Record: recKey(i + it*shape.keys), Entry: []byte("e")}
					if shape.random { // incompressible 16-byte record keys
						k.Record = binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, rng.Uint64()), rng.Uint64())
					}
					be.Put(k, val)
					dirty += int64(len(k.Record) + len(k.Entry) + len(val))
				}
				before := s.Metrics()
				checkpoint(b, be, uint64(it+1))
				after := s.Metrics()
				written = after.RemotePutBytes - before.RemotePutBytes
				puts = after.RemotePuts - before.RemotePuts
				segs = (puts - 2)
			}
			b.ReportMetric(float64(written)/float64(dirty), "written/dirty")
			b.ReportMetric(float64(puts), "puts/ckpt")
			b.ReportMetric(float64(segs), "segments/ckpt")
			if float64(written) > 1.3*float64(dirty) {
				b.Errorf("checkpoint wrote %.2fx the dirty bytes", float64(written)/float64(dirty))
			}
		})
	}
}

// BenchmarkFetchBatching: keys per remote GET for Fetch over co-located keys (target >= 10):
// the entries of one record key (a map state), and records of one key group.
func BenchmarkFetchBatching(b *testing.B) {
	for _, pool := range []string{"mem", "s3"} {
		b.Run(pool, func(b *testing.B) {
			u := "mem://"
			if pool == "s3" {
				u = s3URL(b, "")
			}
			s := openTest(b, u, WithHotBytes(1))
			be := operator(b, s, OperatorOptions{Name: "batch"})
			val := make([]byte, 64)
			for i := range 50_000 {
				be.Put(Key{Record: recKey(i)}, val)
			}
			for e := range 2000 {
				be.Put(Key{State: 1, Record: []byte("hot-user"), Entry: fmt.Appendf(nil, "item-%05d", e)}, val)
			}
			checkpoint(b, be, 1)
			// Records of key group 7.
			var kg7 []Key
			for i := 0; len(kg7) < 256; i++ {
				if KeyGroupOf(recKey(i), 128) == 7 {
					kg7 = append(kg7, Key{Record: recKey(i)})
				}
			}
			var mapKeys []Key
			for e := range 256 {
				mapKeys = append(mapKeys, Key{State: 1, Record: []byte("hot-user"), Entry: fmt.Appendf(nil, "item-%05d", e*7)})
			}
			for _, c := range []struct {
				name string
				keys []Key
			}{{"map-entries", mapKeys}, {"key-group", kg7}} {
				if _, err := fetchSync(b, be, c.keys); err != nil { // load the indexes
					b.Fatal(err)
				}
				before, bm := s.Metrics(), be.Metrics()
				start := time.Now()
				for range b.N {
					f, err := fetchSync(b, be, c.keys)
					if err != nil {
						b.Fatal(err)
					}
					for _, x := range f {
						if !x.Found {
							b.Fatal("missing key")
						}
					}
				}
				el := time.Since(start)
				after, am := s.Metrics(), be.Metrics()
				blocks := am.FetchBlocks - bm.FetchBlocks
				gets := after.RemoteGets - before.RemoteGets
				perGet := float64(am.FetchKeys-bm.FetchKeys) / float64(blocks)
				b.ReportMetric(perGet, c.name+"-keys/GET")
				b.ReportMetric(float64(gets)/float64(b.N), c.name+"-GETs/fetch")
				b.ReportMetric(float64(el.Microseconds())/float64(b.N), c.name+"-us/fetch")
				if perGet < 10 {
					b.Errorf("%s: %.1f keys per GET", c.name, perGet)
				}
			}
		})
	}
}

// BenchmarkRestore: time to first record (open, restore, first cold read) for 100k and 2M keys
// on file:// and S3. Target: 2M <= 2x 100k.
func BenchmarkRestore(b *testing.B) {
	for _, pool := range []string{"file", "s3"} {
		b.Run(pool, func(b *testing.B) {
			base := ""
			switch pool {
			case "file":
				base = "file://" + b.TempDir() + "?fsync=false"
			case "s3":
				base = s3URL(b, "")
			}
			ttfr := map[int]time.Duration{}
			for _, n := range []int{100_000, 2_000_000} {
				name := fmt.Sprint("restore-", n)
				s := openTest(b, base, WithHotBytes(0))
				w := operator(b, s, OperatorOptions{Name: name})
				val := make([]byte, 24)
				for i := range n {
					w.Put(Key{Record: recKey(i)}, val)
				}
				checkpoint(b, w, 1)
				w.Close()
				s.Close()
				rng := rand.New(rand.NewPCG(uint64(n), 3))
				const reps = 7
				var times []time.Duration
				for rep := range reps + 1 {
					start := time.Now()
					s := openTest(b, base)
					r, err := s.Operator(context.Background(), OperatorOptions{Name: name, RestoreFrom: 1})
					if err != nil {
						b.Fatal(err)
					}
					r.Open(testNames)
					k := Key{Record: recKey(rng.IntN(n))}
					if _, _, hot := r.Get(k); hot {
						b.Fatal("restored key reported hot")
					}
					f, err := fetchSync(b, r, []Key{k})
					if err != nil || !f[0].Found {
						b.Fatal(err)
					}
					r.Fill(f)
					if rep > 0 { // the first is a warm-up
						times = append(times, time.Since(start))
					}
					r.Close()
					s.Close()
				}
				ttfr[n] = median(times)
				b.ReportMetric(float64(ttfr[n].Microseconds())/1000, fmt.Sprintf("ttfr-%dk-ms", n/1000))
			}
			ratio := float64(ttfr[2_000_000]) / float64(ttfr[100_000])
			b.ReportMetric(ratio, "ttfr-2M/100k")
			if ratio > 2 {
				b.Errorf("time to first record grows with state: %.2fx", ratio)
			}
		})
	}
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s[len(s)/2]
}

// BenchmarkColdReadFile compares cold-read throughput on the file pool with block reads through
// io_uring (host/uring) against the default goroutine+pread, at several fetch concurrencies,
// with the segment files in the page cache (warm) and dropped from it (cold).
func BenchmarkColdReadFile(b *testing.B) {
	dir := b.TempDir()
	const n = 300_000
	{
		s := openTest(b, "file://"+dir+"?fsync=false&block_size=4k", WithHotBytes(0))
		w := operator(b, s, OperatorOptions{Name: "cold"})
		val := make([]byte, 100)
		for i := range n {
			w.Put(Key{Record: recKey(i)}, val)
		}
		checkpoint(b, w, 1)
		w.Close()
		s.Close()
	}
	rates := map[string]float64{}
	for _, cache := range []string{"warm", "cold"} {
		for _, depth := range []int{1, 16, 64} {
			for _, reader := range []string{"pread", "uring"} {
				name := fmt.Sprintf("cache=%s/depth=%d/%s", cache, depth, reader)
				b.Run(name, func(b *testing.B) {
					q := "?fsync=false&prefetch=false"
					if reader == "uring" {
						q += "&uring=true"
					}
					s, err := Open(context.Background(), "file://"+dir+q, WithHotBytes(1))
					if err != nil {
						b.Skip(err)
					}
					defer s.Close()
					r, err := s.Operator(context.Background(), OperatorOptions{Name: "cold", RestoreFrom: 1})
					if err != nil {
						b.Fatal(err)
					}
					r.Open(testNames)
					defer r.Close()
					// Load the indexes first: this measures block reads only.
					fetchSync(b, r, []Key{{Record: recKey(0)}})
					if cache == "cold" {
						dropSegmentCache(b, dir)
					}
					rng := rand.New(rand.NewPCG(9, uint64(depth)))
					const reads = 4000
					keys := make([][]Key, reads)
					for i := range keys {
						keys[i] = []Key{{Record: recKey(rng.IntN(n))}}
					}
					b.ResetTimer()
					start := time.Now()
					for range b.N {
						var wg sync.WaitGroup
						sem := make(chan struct{}, depth)
						for i := range reads {
							sem <- struct{}{}
							wg.Add(1)
							r.Fetch(keys[i], func(f []Fetched, err error) {
								if err != nil || !f[0].Found {
									b.Error("cold read failed", err)
								}
								<-sem
								wg.Done()
							})
						}
						wg.Wait()
					}
					rate := float64(reads*b.N) / time.Since(start).Seconds()
					b.ReportMetric(rate, "reads/s")
					rates[name] = rate
					if reader == "uring" {
						if p := rates[strings.TrimSuffix(name, "uring")+"pread"]; p > 0 {
							b.ReportMetric(rate/p, "uring/pread")
						}
					}
				})
			}
		}
	}
}

func dropSegmentCache(b *testing.B, dir string) {
	filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() || !strings.HasSuffix(p, segSuffix) {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return nil
		}
		defer f.Close()
		_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		return nil
	})
}

var persistDirtyRuns int

// BenchmarkPersistDirty: the persist of a checkpoint of 100k dirty counters (the issue-12
// pipeline's every second), in CPU time (the process's, from getrusage) rather than wall time,
// which the machine's other load distorts.
func BenchmarkPersistDirty(b *testing.B) {
	const keys, rounds = 100_000, 5
	ctx := context.Background()
	persistDirtyRuns++ // the framework calls a benchmark more than once: a store of its own each time
	s := openTest(b, fmt.Sprintf("mem://persistdirty-%d", persistDirtyRuns))
	be := operator(b, s, OperatorOptions{Name: "pd"})
	var cell [8]byte
	rng := rand.New(rand.NewPCG(5, 6))
	kb := make([]byte, 0, 16)
	var cpu []time.Duration
	for r := range rounds * b.N {
		for range keys {
			kb = fmt.Appendf(kb[:0], "k%d", rng.IntN(keys))
			binary.LittleEndian.PutUint64(cell[:], uint64(r))
			be.Put(Key{State: 0, Record: kb}, cell[:])
		}
		snap, err := be.Capture(uint64(r + 1))
		if err != nil {
			b.Fatal(err)
		}
		c0 := processCPU()
		if err := snap.Persist(ctx); err != nil {
			b.Fatal(err)
		}
		cpu = append(cpu, processCPU()-c0)
	}
	slices.Sort(cpu)
	b.ReportMetric(float64(cpu[len(cpu)/2].Microseconds())/1000, "persist-cpu-ms")
}

// processCPU is this process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkGetAbsent is the prefetch check of a key no segment holds, over a tier of many
// segments (a tenth hot spills every ~10 ms, and 50 segments wait for a checkpoint or a
// compaction at times): the filters of every segment that may hold the key are asked.
func BenchmarkGetAbsent(b *testing.B) {
	for _, segs := range []int{1, 10, 50} {
		b.Run(fmt.Sprintf("segs-%d", segs), func(b *testing.B) {
			s := openTest(b, "mem://"+randomHex(8), WithMaxSegments(1<<20))
			t := operator(b, s, OperatorOptions{})
			for i := range segs {
				for j := range 200 {
					t.Put(key(0, fmt.Sprintf("k%d-%d", i, j), ""), []byte("v"))
				}
				checkpoint(b, t, uint64(i+1))
			}
			t.Get(key(0, "x", "")) // observes the commits
			if n := len(t.version.Load().segs); n != segs {
				b.Fatalf("%d segments, want %d", n, segs)
			}
			keys := make([]Key, 1024)
			for i := range keys {
				keys[i] = key(0, fmt.Sprintf("absent-%d", i), "")
			}
			b.ResetTimer()
			positives := 0
			for i := 0; b.Loop(); i++ {
				if _, _, hot := t.Get(keys[i%len(keys)]); !hot {
					positives++ // a filter's false positive: the key would be read
				}
			}
			b.ReportMetric(float64(positives)/float64(b.N), "false-positives/op")
		})
	}
}

// BenchmarkGetColdPresent is the prefetch check of a key the tier does not hold hot but the
// oldest segment (the restored checkpoint's base) does, under segs newer segments without it:
// the miss of a tier holding a fraction of its keys (issue 10). Every segment's filter is
// loaded; the check ends at the first that may hold the key.
func BenchmarkGetColdPresent(b *testing.B) {
	for _, segs := range []int{1, 10, 50} {
		b.Run(fmt.Sprintf("segs-%d", segs), func(b *testing.B) {
			url := "mem://" + randomHex(8)
			s := openTest(b, url, WithMaxSegments(1<<20))
			t := operator(b, s, OperatorOptions{})
			keys := make([]Key, 8192)
			for i := range keys {
				keys[i] = key(0, fmt.Sprintf("old-%d", i), "")
				t.Put(keys[i], []byte("v"))
			}
			checkpoint(b, t, 1)
			for i := range segs {
				for j := range 200 {
					t.Put(key(0, fmt.Sprintf("k%d-%d", i, j), ""), []byte("v"))
				}
				checkpoint(b, t, uint64(i+2))
			}
			t.Close()
			s.Close()
			s = openTest(b, url, WithMaxSegments(1<<20))
			t = operator(b, s, OperatorOptions{RestoreFrom: RestoreLatest})
			if n := len(t.version.Load().segs); n != segs+1 {
				b.Fatalf("%d segments, want %d", n, segs+1)
			}
			if _, err := fetchSync(b, t, keys); err != nil { // loads every segment's filter
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if _, _, hot := t.Get(keys[i%len(keys)]); hot {
					b.Fatal("a key not fetched is hot")
				}
			}
		})
	}
}
