package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/clink-wasm/clink-wasm/host/cluster"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// cmdWorker is `clink-wasm worker --pipeline FILE`: one member of the pipeline's Kafka
// consumer group, running the partitions the group gives it (docs/SCALING.md). It runs until
// SIGINT/SIGTERM, then commits a final checkpoint of every partition it owns and leaves the
// group, so that the others take them over at once.
func cmdWorker(ctx context.Context, args []string, out, stderr io.Writer) error {
	fs := newFlags("worker", "worker --pipeline SPEC.yaml --state s3://bucket/prefix [flags]", stderr)
	var (
		specPath  = fs.String("pipeline", "", "pipeline spec (YAML or JSON) with one Kafka source")
		stateURL  = fs.String("state", "", "state pool shared by every worker when the spec names none: s3://bucket/prefix?endpoint=... (file:// works for workers on one machine)")
		group     = fs.String("group", "", "consumer group (default clink.NAME)")
		protocol  = fs.String("group-protocol", cluster.ProtocolClassic, "classic (cooperative-sticky) or consumer (KIP-848, Kafka 4.0+)")
		session   = fs.Duration("session-timeout", 10*time.Second, "the group's session timeout: how long a dead worker keeps its partitions")
		heartbeat = fs.Duration("heartbeat", 250*time.Millisecond, "heartbeat interval: members learn of a rebalance at their next heartbeat, so it is part of every join's hand-over")
		rebalance = fs.Duration("rebalance-timeout", 60*time.Second, "how long a revoke may take (final checkpoints of the revoked partitions)")
		verbose   = fs.Bool("v", false, "log task events and the runtime's events on stderr")
		noCache   = fs.Bool("no-cache", false, "do not use the on-disk compilation cache")
	)
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("worker: unexpected argument %q", fs.Arg(0))
	}
	if *specPath == "" {
		return usagef("worker: --pipeline needs a spec file")
	}
	for name, d := range map[string]time.Duration{"session-timeout": *session, "heartbeat": *heartbeat, "rebalance-timeout": *rebalance} {
		if d <= 0 {
			return usagef("worker: --%s must be positive", name)
		}
	}
	if *heartbeat >= *session {
		return usagef("worker: --heartbeat (%v) must be shorter than --session-timeout (%v)", *heartbeat, *session)
	}
	spec, err := readSpec(*specPath)
	if err != nil {
		return err
	}
	log := runtimeLog(stderr, *verbose)
	env := pipeline.Env{BaseDir: filepath.Dir(*specPath), Log: log, GuestLog: stderr, CacheDir: compileCacheDir(*noCache)}
	installKillHook(&env)
	o := cluster.Options{
		Spec: spec, Env: env, StateURL: *stateURL, Group: *group, Protocol: *protocol,
		SessionTimeout: *session, HeartbeatInterval: *heartbeat, RebalanceTimeout: *rebalance, Log: log,
		NewConnectors: func() *pipeline.Connectors { return allConnectors(out) },
	}
	var w *cluster.Worker
	installWorkerKillHook(func() bool { return w.Revoking() }, &o)
	w, err = cluster.New(o)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "worker: joining group %s\n", w.Group())
	err = w.Run(ctx)
	if err != nil && errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// installWorkerKillHook is fault injection for the scale-out crash tests:
// CLINK_TEST_WORKER_KILL=STEP makes the process SIGKILL itself at a step of a revoke or an
// assign:
//
//	revoke:PHASE     at commit phase PHASE (acknowledged, prepared, decided, record-written)
//	                 of a final checkpoint taken on revoke
//	assign:assigned  when a partition is assigned, before its task restores
//	assign:started   once a task restored and runs
//
// It is inert unless the variable is set.
func installWorkerKillHook(revoking func() bool, o *cluster.Options) {
	v := os.Getenv("CLINK_TEST_WORKER_KILL")
	step, arg, ok := strings.Cut(v, ":")
	if !ok {
		return
	}
	kill := func() {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	switch step {
	case "revoke":
		prev := o.Env.OnCommitPhase
		o.Env.OnCommitPhase = func(p pipeline.CommitPhase, id uint64) error {
			if string(p) == arg && revoking() {
				kill()
			}
			if prev != nil {
				return prev(p, id)
			}
			return nil
		}
	case "assign":
		o.OnEvent = func(e cluster.Event) {
			if (arg == "assigned" && e.Kind == cluster.TaskAssigned) || (arg == "started" && e.Kind == cluster.TaskStarted) {
				kill()
			}
		}
	}
}
