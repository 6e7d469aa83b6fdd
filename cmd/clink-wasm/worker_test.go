package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/clink-wasm/clink-wasm/host/cluster/clustertest"
)

// workerProc is one `clink-wasm worker` process (this test binary as the CLI).
type workerProc struct {
	cmd *exec.Cmd
	mu  sync.Mutex
	log bytes.Buffer
}

func (w *workerProc) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.log.Write(b)
}

func (w *workerProc) logText() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.log.String()
}

type workerRig struct {
	t       *testing.T
	brokers []string
	spec    string
	state   string
	cache   string
	procs   []*workerProc
}

func newWorkerRig(t *testing.T, parts int32) *workerRig {
	t.Helper()
	dir := t.TempDir()
	brokers := clustertest.Kafka(t, parts)
	wasm, err := filepath.Abs("../../examples/wasm/counter/counter-as.wasm")
	if err != nil {
		t.Fatal(err)
	}
	bj, _ := json.Marshal(brokers)
	spec := fmt.Sprintf(`version: 1
name: cnt
key_groups: 8
checkpoints: {interval: 100ms}
sources:
  - {name: in, type: kafka, brokers: %s, topics: [in], start_from: earliest}
operators:
  - {name: count, module: %s, inputs: [in], key: {source: true}}
sinks:
  - {name: out, type: kafka, brokers: %s, topic: out, inputs: [count]}
`, bj, wasm, bj)
	specPath := filepath.Join(dir, "spec.yaml")
	if err := os.WriteFile(specPath, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	return &workerRig{t: t, brokers: brokers, spec: specPath, state: clustertest.StateURL(t, filepath.Join(dir, "state")), cache: filepath.Join(dir, "cache")}
}

// start starts a worker process with extra environment (fault hooks).
func (r *workerRig) start(env ...string) *workerProc {
	r.t.Helper()
	w := &workerProc{}
	w.cmd = exec.Command(os.Args[0], "worker", "--pipeline", r.spec, "--state", r.state,
		"--session-timeout", "1500ms", "--heartbeat", "100ms", "-v")
	w.cmd.Env = append(append(os.Environ(), "CLINK_CLI_CHILD=1", "XDG_CACHE_HOME="+r.cache), env...)
	w.cmd.Stdout, w.cmd.Stderr = w, w
	if err := w.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	r.procs = append(r.procs, w)
	r.t.Cleanup(func() {
		_ = w.cmd.Process.Signal(syscall.SIGCONT)
		if r.t.Failed() {
			// A live worker of a failed test prints its goroutines (Go's SIGQUIT) before it
			// dies: where a step it never finished was waiting.
			done := make(chan struct{})
			go func() { _ = w.cmd.Wait(); close(done) }()
			if w.cmd.Process.Signal(syscall.SIGQUIT) == nil {
				select {
				case <-done:
				case <-time.After(10 * time.Second):
				}
			}
			_ = w.cmd.Process.Kill()
			<-done
		} else {
			_ = w.cmd.Process.Kill()
			_ = w.cmd.Wait()
		}
		if r.t.Failed() {
			r.t.Logf("worker %d log:\n%s", w.cmd.Process.Pid, w.logText())
		}
	})
	return w
}

// stop ends a worker with SIGTERM (final checkpoints, leave) and waits for it.
func (w *workerProc) stop(t *testing.T) {
	t.Helper()
	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("worker %d: %v\n%s", w.cmd.Process.Pid, err, w.logText())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("worker %d did not stop", w.cmd.Process.Pid)
	}
}

// members returns the group's member count and the partitions assigned, once the group is
// stable (0, 0 while it rebalances).
func (r *workerRig) members() (int, int) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.brokers...))
	if err != nil {
		r.t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	gs, err := kadm.NewClient(cl).DescribeGroups(ctx, "clink.cnt")
	if err != nil {
		return 0, 0
	}
	g := gs["clink.cnt"]
	if g.Err != nil || g.State != "Stable" {
		return 0, 0
	}
	parts := 0
	for _, m := range g.Members {
		if ca, ok := m.Assigned.AsConsumer(); ok {
			for _, t := range ca.Topics {
				parts += len(t.Partitions)
			}
		}
	}
	return len(g.Members), parts
}

// waitGroup waits until the group is stable with n members sharing every partition.
func (r *workerRig) waitGroup(n, parts int) {
	r.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		m, p := r.members()
		if m == n && p == parts {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("the group did not settle on %d members and %d partitions (now %d, %d)", n, parts, m, p)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitOutputs waits until the committed output holds total records, then checks it
// against the model.
func (r *workerRig) waitOutputs(want map[string]int) {
	r.t.Helper()
	total := 0
	for _, n := range want {
		total += n
	}
	deadline := time.Now().Add(90 * time.Second)
	for clustertest.Total(clustertest.CommittedCounts(r.t, r.brokers)) < total {
		if time.Now().After(deadline) {
			r.t.Fatalf("the committed output did not reach %d records", total)
		}
		time.Sleep(100 * time.Millisecond)
	}
	clustertest.CheckExactlyOnce(r.t, clustertest.CommittedCounts(r.t, r.brokers), want)
}

var taskEvent = regexp.MustCompile(`msg="task (\w+)" partition=(\d+)`)

// events returns the worker's task events after byte offset from of its log.
func (w *workerProc) events(from int) []string {
	text := w.logText()
	var out []string
	for _, m := range taskEvent.FindAllStringSubmatch(text[min(from, len(text)):], -1) {
		p, _ := strconv.Atoi(m[2])
		out = append(out, fmt.Sprintf("%s %d", m[1], p))
	}
	return out
}

// TestWorkerProcesses: three worker processes on loopback against kfake (and versitygw under
// scripts/with-s3.sh). One is SIGKILLed, one is added, one is paused with SIGSTOP past its
// session timeout and resumed (a zombie): the committed output has exactly one output per
// input record, and each key's final state matches the model.
func TestWorkerProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("worker processes: not in -short")
	}
	const parts = 6
	r := newWorkerRig(t, parts)
	want := map[string]int{}
	w1, w2, w3 := r.start(), r.start(), r.start()
	clustertest.Add(want, clustertest.Produce(t, r.brokers, 0, 600, 30))
	r.waitGroup(3, parts)
	r.waitOutputs(want)

	// SIGKILL one mid-stream: its partitions move after the session timeout.
	clustertest.Add(want, clustertest.Produce(t, r.brokers, 600, 600, 30))
	if err := w1.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	r.waitGroup(2, parts)
	clustertest.Add(want, clustertest.Produce(t, r.brokers, 1200, 300, 30))
	r.waitOutputs(want)

	// Add one.
	w4 := r.start()
	clustertest.Add(want, clustertest.Produce(t, r.brokers, 1500, 300, 30))
	r.waitGroup(3, parts)
	r.waitOutputs(want)

	// A zombie: records in flight, then SIGSTOP past the session timeout.
	clustertest.Add(want, clustertest.Produce(t, r.brokers, 1800, 600, 30))
	if err := w2.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	r.waitGroup(2, parts)
	clustertest.Add(want, clustertest.Produce(t, r.brokers, 2400, 300, 30))
	r.waitOutputs(want)
	mark := len(w2.logText())
	if err := w2.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// It learns of its loss and rejoins; what it had in flight is fenced, never committed.
	r.waitGroup(3, parts)
	clustertest.Add(want, clustertest.Produce(t, r.brokers, 2700, 300, 30))
	r.waitOutputs(want)
	for _, e := range w2.events(mark) {
		if regexp.MustCompile(`^released `).MatchString(e) {
			t.Errorf("the zombie committed a final checkpoint after it resumed: %q (events %v)", e, w2.events(mark))
		}
	}
	if evs := w2.events(mark); len(evs) == 0 {
		t.Errorf("the zombie reported no task event after it resumed (want its partitions lost)")
	}
	t.Logf("zombie events after resume: %v", w2.events(mark))
	for _, w := range []*workerProc{w2, w3, w4} {
		w.stop(t)
	}
	clustertest.CheckExactlyOnce(t, clustertest.CommittedCounts(t, r.brokers), want)
}

// TestWorkerCrashSteps: a worker SIGKILLs itself at each step of a revoke (at each commit
// phase of the final checkpoint it takes for the revoked partitions) and of an assign
// (assigned, before its task restores; started, once it restored). The survivor takes
// every partition over after the session timeout; the committed output has exactly one
// output per input record.
func TestWorkerCrashSteps(t *testing.T) {
	if testing.Short() {
		t.Skip("worker processes: not in -short")
	}
	steps := []string{"revoke:acknowledged", "revoke:prepared", "revoke:decided", "revoke:record-written",
		"assign:assigned", "assign:started"}
	for _, step := range steps {
		t.Run(step, func(t *testing.T) {
			const parts = 4
			r := newWorkerRig(t, parts)
			want := map[string]int{}
			hook := "CLINK_TEST_WORKER_KILL=" + step
			var first, second *workerProc
			if strings.HasPrefix(step, "revoke:") {
				// The doomed worker owns everything; a join makes it revoke half.
				first = r.start(hook)
				r.waitGroup(1, parts)
				clustertest.Add(want, clustertest.Produce(t, r.brokers, 0, 400, 20))
				r.waitOutputs(want)
				clustertest.Add(want, clustertest.Produce(t, r.brokers, 400, 400, 20))
				second = r.start()
			} else {
				first = r.start()
				r.waitGroup(1, parts)
				clustertest.Add(want, clustertest.Produce(t, r.brokers, 0, 400, 20))
				r.waitOutputs(want)
				clustertest.Add(want, clustertest.Produce(t, r.brokers, 400, 400, 20))
				second = r.start(hook) // dies when it gets its partitions
			}
			doomed, survivor := first, second
			if strings.HasPrefix(step, "assign:") {
				doomed, survivor = second, first
			}
			err := doomed.cmd.Wait()
			ee, ok := err.(*exec.ExitError)
			if !ok || !ee.Sys().(syscall.WaitStatus).Signaled() {
				t.Fatalf("the worker with %s exited with %v, want killed at the step\n%s", hook, err, doomed.logText())
			}
			r.waitGroup(1, parts)
			clustertest.Add(want, clustertest.Produce(t, r.brokers, 800, 200, 20))
			r.waitOutputs(want)
			survivor.stop(t)
			clustertest.CheckExactlyOnce(t, clustertest.CommittedCounts(t, r.brokers), want)
		})
	}
}

// TestWorkerChaos is `make soak`'s loop (CLINK_WORKER_SOAK=ROUNDS): worker processes are
// SIGKILLed, added, stopped, and paused past their session timeout at random while input
// flows; after each round the committed output is checked against the model.
func TestWorkerChaos(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("CLINK_WORKER_SOAK"))
	if rounds <= 0 {
		t.Skip("the chaos loop runs under make soak (CLINK_WORKER_SOAK=ROUNDS)")
	}
	const parts = 6
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 16))
	r := newWorkerRig(t, parts)
	want := map[string]int{}
	live := []*workerProc{r.start(), r.start()}
	next := 0
	for round := range rounds {
		clustertest.Add(want, clustertest.Produce(t, r.brokers, next, 300, 40))
		next += 300
		switch a := rng.IntN(5); {
		case a == 0 && len(live) > 1: // SIGKILL
			i := rng.IntN(len(live))
			_ = live[i].cmd.Process.Kill()
			_ = live[i].cmd.Wait()
			live = slices.Delete(live, i, i+1)
			t.Logf("round %d: killed one, %d left", round, len(live))
		case a == 1 && len(live) < 4: // join
			live = append(live, r.start())
			t.Logf("round %d: added one, %d now", round, len(live))
		case a == 2 && len(live) > 1: // graceful leave
			i := rng.IntN(len(live))
			live[i].stop(t)
			live = slices.Delete(live, i, i+1)
			t.Logf("round %d: stopped one, %d left", round, len(live))
		case a == 3 && len(live) > 1: // zombie: paused past the session timeout, resumed
			z := live[rng.IntN(len(live))]
			_ = z.cmd.Process.Signal(syscall.SIGSTOP)
			r.waitGroup(len(live)-1, parts)
			clustertest.Add(want, clustertest.Produce(t, r.brokers, next, 300, 40))
			next += 300
			_ = z.cmd.Process.Signal(syscall.SIGCONT)
			t.Logf("round %d: paused and resumed one", round)
		default:
			t.Logf("round %d: input only", round)
		}
		r.waitGroup(len(live), parts)
		r.waitOutputs(want)
	}
	for _, w := range live {
		w.stop(t)
	}
	clustertest.CheckExactlyOnce(t, clustertest.CommittedCounts(t, r.brokers), want)
}
