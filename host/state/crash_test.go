package state

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The crash test re-executes the test binary as a child that checkpoints a deterministic
// workload in a loop against a file:// pool, and kills it with SIGKILL at random points (most
// land inside a checkpoint: writing segments, the head, the manifest, or compacting and
// collecting garbage). After each kill the parent restores the newest complete checkpoint and
// verifies every key against a model replayed from the workload; that checkpoint must not be
// older than the last one the child acknowledged.
//
// Rounds: 6 by default; CLINK_STATE_SOAK=1 runs 200:
//
//	CLINK_STATE_SOAK=1 go test -run TestCrashRecovery -v ./host/state/

const crashKeys = 600

const crashURLQuery = "?fsync=false&hot_bytes=16k&max_segments=3&segment_size=8k&block_size=1k&retain=2&retention=3s&gc_interval=50ms"

// crashOps applies checkpoint c's deterministic writes to put/del.
func crashOps(c uint64, put func(k, v string), del func(k string)) {
	rng := rand.New(rand.NewPCG(c, 1234))
	for i := range 250 {
		k := fmt.Sprint("k", rng.IntN(crashKeys))
		if rng.IntN(8) == 0 {
			del(k)
		} else {
			put(k, fmt.Sprintf("c%d-i%d-%s", c, i, strings.Repeat("x", rng.IntN(40))))
		}
	}
}

func crashModel(upTo uint64) map[string]string {
	m := map[string]string{}
	for c := uint64(1); c <= upTo; c++ {
		crashOps(c, func(k, v string) { m[k] = v }, func(k string) { delete(m, k) })
	}
	return m
}

func TestMain(m *testing.M) {
	if dir := os.Getenv("CLINK_STATE_CRASH_CHILD"); dir != "" {
		crashChild(dir)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func crashChild(dir string) {
	ctx := context.Background()
	s, err := Open(ctx, "file://"+dir+crashURLQuery)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	b, err := s.Operator(ctx, OperatorOptions{Name: "crash", RestoreFrom: RestoreLatest})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	b.Open([]string{"v"})
	b.mu.Lock()
	c := b.mu.base.Checkpoint
	b.mu.Unlock()
	fmt.Println("restored", c)
	for {
		c++
		crashOps(c, func(k, v string) { b.Put(Key{Record: []byte(k)}, []byte(v)) },
			func(k string) { b.Delete(Key{Record: []byte(k)}) })
		// Read some keys through the cold path too, as an operator would.
		for i := range 20 {
			k := Key{Record: []byte(fmt.Sprint("k", (int(c)*7+i)%crashKeys))}
			if _, _, hot := b.Get(k); !hot {
				done := make(chan []Fetched, 1)
				b.Fetch([]Key{k}, func(f []Fetched, err error) {
					if err != nil {
						fmt.Println("error", err)
						os.Exit(2)
					}
					done <- f
				})
				b.Fill(<-done)
			}
		}
		snap, err := b.Capture(c)
		if err != nil {
			fmt.Println("error", err)
			os.Exit(2)
		}
		if err := snap.Persist(ctx); err != nil {
			fmt.Println("error", err)
			os.Exit(2)
		}
		fmt.Println("acked", c)
	}
}

func TestCrashRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test re-executes the test binary")
	}
	rounds := 6
	if os.Getenv("CLINK_STATE_SOAK") != "" {
		rounds = 200
	}
	dir := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 5))
	var lastAcked uint64
	for round := range rounds {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), "CLINK_STATE_CRASH_CHILD="+dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan string, 1024)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		// Let it restore and make some progress, then kill it at a random point.
		deadline := time.After(time.Duration(30+rng.IntN(400)) * time.Millisecond)
	wait:
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					break wait
				}
				if strings.HasPrefix(l, "error") {
					t.Fatalf("round %d child: %s", round, l)
				}
				if v, ok := strings.CutPrefix(l, "acked "); ok {
					lastAcked, _ = strconv.ParseUint(v, 10, 64)
				}
			case <-deadline:
				break wait
			}
		}
		_ = cmd.Process.Signal(syscall.SIGKILL)
		for l := range lines {
			if v, ok := strings.CutPrefix(l, "acked "); ok {
				lastAcked, _ = strconv.ParseUint(v, 10, 64)
			}
		}
		_ = cmd.Wait()

		// Restore the newest complete checkpoint and verify every key.
		s, err := Open(context.Background(), "file://"+dir+crashURLQuery)
		if err != nil {
			t.Fatal(err)
		}
		complete, _, err := s.Checkpoints(context.Background(), "", "crash", 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(complete) == 0 {
			if lastAcked != 0 {
				t.Fatalf("round %d: acked %d but nothing restorable", round, lastAcked)
			}
			s.Close()
			continue
		}
		latest := complete[0]
		if latest < lastAcked {
			t.Fatalf("round %d: acknowledged checkpoint %d lost (newest complete %d)", round, lastAcked, latest)
		}
		b, err := s.Operator(context.Background(), OperatorOptions{Name: "crash", RestoreFrom: latest})
		if err != nil {
			t.Fatalf("round %d: restore %d: %v", round, latest, err)
		}
		b.Open([]string{"v"})
		want := crashModel(latest)
		var keys []Key
		for i := range crashKeys {
			keys = append(keys, Key{Record: []byte(fmt.Sprint("k", i))})
		}
		f, err := fetchSync(t, b, keys)
		if err != nil {
			t.Fatalf("round %d: read checkpoint %d: %v", round, latest, err)
		}
		for _, x := range f {
			w, ok := want[string(x.Key.Record)]
			if x.Found != ok || ok && string(x.Value) != w {
				t.Fatalf("round %d checkpoint %d key %s: got %q,%v want %q,%v", round, latest, x.Key.Record, x.Value, x.Found, w, ok)
			}
		}
		t.Logf("round %d: killed after ack %d, restored %d, %d keys verified", round, lastAcked, latest, len(f))
		b.Close()
		s.Close()
	}
}
