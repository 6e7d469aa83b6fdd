package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// hasPipelineFlag reports whether run was given --pipeline: then the spec form runs.
func hasPipelineFlag(args []string) bool {
	return slices.ContainsFunc(args, func(a string) bool {
		return a == "--pipeline" || a == "-pipeline" || strings.HasPrefix(a, "--pipeline=") || strings.HasPrefix(a, "-pipeline=")
	})
}

// cmdRunPipeline is `clink-wasm run --pipeline FILE`: it runs a pipeline spec through the
// parallel runtime of host/pipeline until a bounded job finishes (or, for a streaming job,
// until SIGINT/SIGTERM).
func cmdRunPipeline(ctx context.Context, args []string, out, stderr io.Writer) error {
	fs := newFlags("run", "run --pipeline SPEC.yaml [--restore latest] [flags]", stderr)
	var (
		specPath = fs.String("pipeline", "", "pipeline spec (YAML or JSON; see docs/pipeline-spec.md)")
		restore  = fs.String("restore", "none", "none, latest (the newest committed checkpoint; fails if there is none), latest-if-any (the latest if there is one, else start empty) or a checkpoint id")
		stateURL = fs.String("state", "", "state pool when the spec names none: file:///dir, s3://..., mem:// (default: file:// in "+pipeline.DefaultStateDir+")")
		quiet    = fs.Bool("quiet", false, "no summary")
		stats    = fs.Bool("stats", false, "print the job's metrics as JSON on stderr at the end")
		verbose  = fs.Bool("v", false, "log the runtime's events (checkpoints, stuck channels) on stderr")
		noCache  = fs.Bool("no-cache", false, "do not use the on-disk compilation cache")
	)
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("run: unexpected argument %q", fs.Arg(0))
	}
	if *specPath == "" {
		return usagef("run: --pipeline needs a spec file")
	}
	switch r := strings.ToLower(*restore); r {
	case "", "none", "latest", "latest-if-any", "if-any":
	default:
		if id, err := strconv.ParseUint(r, 10, 64); err != nil || id == 0 {
			return usagef("run: --restore wants none, latest, latest-if-any or a checkpoint id, not %q", *restore)
		}
	}
	spec, err := readSpec(*specPath)
	if err != nil {
		return err
	}
	if *stateURL == "" {
		if *stateURL, err = pipeline.StateURLForDir(pipeline.DefaultStateDir); err != nil {
			return err
		}
	}
	env := pipeline.Env{
		Connectors: allConnectors(out), BaseDir: filepath.Dir(*specPath), StateURL: *stateURL, Restore: *restore,
		Log: runtimeLog(stderr, *verbose), GuestLog: stderr, CacheDir: compileCacheDir(*noCache),
	}
	installKillHook(&env)
	installKafkaKillHook()
	start := time.Now()
	job, err := pipeline.Start(ctx, spec, env)
	if err != nil {
		if errors.Is(err, pipeline.ErrNoCheckpoint) {
			return fmt.Errorf("%w: run without --restore, or with --restore latest-if-any", err)
		}
		return err
	}
	var m pipeline.JobMetrics
	select {
	case <-job.Done():
		m, err = job.Wait()
	case <-ctx.Done():
		// SIGINT/SIGTERM: stop at once; the committed output ends at the last checkpoint.
		job.Stop(context.Background(), false)
		m, err = job.Wait()
		if err == nil {
			err = errors.New("interrupted")
		}
	}
	if !*quiet {
		printJobSummary(stderr, spec, m, err, time.Since(start))
	}
	if *stats {
		enc := json.NewEncoder(stderr)
		enc.SetIndent("", "  ")
		enc.Encode(m)
	}
	return err
}

func printJobSummary(w io.Writer, spec *pipeline.Spec, m pipeline.JobMetrics, err error, took time.Duration) {
	status := "done"
	switch {
	case err != nil && m.State == pipeline.JobStopped:
		status = "stopped"
	case err != nil:
		status = "failed"
	}
	var in, out int64
	for _, s := range m.Sources {
		in += s.RecordsIn
	}
	for _, s := range m.Sinks {
		out += s.RecordsIn
	}
	fmt.Fprintf(w, "%s %s: %d records in, %d out in %v", spec.Name, status, in, out, took.Round(time.Millisecond))
	if m.Restored != 0 {
		fmt.Fprintf(w, " (restored from checkpoint %d)", m.Restored)
	}
	fmt.Fprintln(w)
	if c := m.LastCheckpoint; c != nil {
		kind := "checkpoint"
		if c.Savepoint {
			kind = "savepoint"
		}
		fmt.Fprintf(w, "last %s %d committed; it covers the input up to %s", kind, c.ID, describePositions(c.Positions))
		if !c.Final {
			fmt.Fprint(w, "; resume with --restore latest")
		}
		fmt.Fprintln(w)
	} else if err != nil {
		fmt.Fprintln(w, "no checkpoint was committed in this run")
	}
}

// describePositions renders "in: orders.jsonl byte 1234 (line 56)".
func describePositions(pos map[string][]pipeline.Split) string {
	var names []string
	for n := range pos {
		names = append(names, n)
	}
	slices.Sort(names)
	var parts []string
	for _, n := range names {
		for _, s := range pos[n] {
			var fp struct {
				Offset *int64 `json:"offset"`
				Line   int64  `json:"line"`
				Done   bool   `json:"done"`
			}
			desc := string(s.Position)
			if json.Unmarshal(s.Position, &fp) == nil && fp.Offset != nil {
				desc = fmt.Sprintf("byte %d (line %d)", *fp.Offset, fp.Line)
				if fp.Done {
					desc = "the end"
				}
			} else if s.Position == nil {
				desc = "the start"
			} else if _, err := strconv.ParseInt(desc, 10, 64); err == nil {
				desc = "record " + desc
			}
			parts = append(parts, fmt.Sprintf("%s: %s at %s", n, filepath.Base(s.ID), desc))
		}
	}
	if len(parts) == 0 {
		return "(no splits)"
	}
	return strings.Join(parts, ", ")
}

// installKillHook is fault injection for the crash tests: CLINK_TEST_KILL_AT=PHASE:N makes the
// process SIGKILL itself at commit phase PHASE (acknowledged, record-written, sink-committed,
// ...) of its Nth checkpoint. It is inert unless the variable is set.
func installKillHook(env *pipeline.Env) { env.OnCommitPhase = killHook() }

// killHook returns the hook of CLINK_TEST_KILL_AT, or nil when it is not set.
func killHook() func(pipeline.CommitPhase, uint64) error {
	v := os.Getenv("CLINK_TEST_KILL_AT")
	if v == "" {
		return nil
	}
	phase, ns, ok := strings.Cut(v, ":")
	n, err := strconv.Atoi(ns)
	if !ok || err != nil || n < 1 {
		return nil
	}
	var seen atomic.Int64
	return func(p pipeline.CommitPhase, id uint64) error {
		if p == pipeline.PhaseAcknowledged {
			seen.Add(1)
		}
		if string(p) == phase && seen.Load() == int64(n) {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		return nil
	}
}
