package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/lookup"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
	"github.com/clink-wasm/clink-wasm/host/scheduler"
)

func newFlags(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: clink-wasm %s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errHelp
		}
		return &usageError{err.Error()}
	}
	return nil
}

// parseInterspersed parses flags that may come before, between or after the positional
// arguments (which it returns), as users of manifest embed and inspect expect. After "--"
// everything is positional.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parse(fs, args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			return append(pos, rest...), nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

func cmdRun(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) (err error) {
	if hasPipelineFlag(args) { // the spec form: pipeline_run.go
		return cmdRunPipeline(ctx, args, stdout, stderr)
	}
	fs := newFlags("run", "run --module OP.wasm --input FILE [--key FIELD] [flags]", stderr)
	var (
		modPath    = fs.String("module", "", "operator module (.wasm)")
		input      = fs.String("input", "", "input file of JSON Lines or CSV records (- for stdin)")
		format     = fs.String("format", "", "input format: jsonl or csv (default: from the file extension, else jsonl)")
		output     = fs.String("output", "", "write output JSON Lines here instead of stdout")
		key        = fs.String("key", "", "key records by this top-level field (default: the module's clink_key, else one key)")
		timeField  = fs.String("time-field", "", "take event time from this field (epoch ms or RFC 3339); default ingestion time")
		wmDelay    = fs.Duration("watermark-delay", 0, "bounded out-of-orderness: watermark = max event time seen - delay")
		onBad      = fs.String("on-malformed", "fail", "malformed input line: fail (stop with its line number) or skip")
		deadLetter = fs.String("dead-letter", "", "with --on-malformed=skip, write skipped lines here as JSON Lines;\nwith --on-error=dead-letter, the records the module faulted on too")
		onError    = fs.String("on-error", "fail", "the module faults on a record: fail (stop, naming the operator and the input line) or\ndead-letter (write the record to --dead-letter with the reason, and go on)")
		retries    = fs.Int("retries", 0, "run a record whose call faulted without effect again up to this many times (0-10) before --on-error applies")
		inFlight   = fs.Int("max-in-flight", 0, "records in flight, > 0 (default 6000; instances have their own memory budget)")
		callTime   = fs.Duration("call-timeout", abi.DefaultCallTime, "time limit per guest call (suspension excluded), > 0")
		memPages   = fs.Uint("max-memory-pages", abi.DefaultMemoryPages, "linear memory limit per instance, in 64 KiB pages (1 to 65536)")
		stateURL   = fs.String("state", "", "durable state pool: file:///dir, s3://bucket/prefix?endpoint=..., mem:// (default: file:// in "+pipeline.DefaultStateDir+")")
		hotBytes   = fs.String("hot-bytes", "", "bound on the state pool's in-memory hot tier, e.g. 64m or 1g (default: the pool's hot_bytes, 256m)")
		job        = fs.String("job", "", "the job's name in the state pool (default: the operator's name)")
		restore    = fs.String("restore", "none", "restore state from a checkpoint: none, latest (fails if there is none),\nlatest-if-any (the latest if there is one, else start empty), or a checkpoint id")
		ckptEvery  = fs.Duration("checkpoint-interval", 10*time.Second, "time between checkpoints; 0 takes only the final one (always taken at the end)")
		endpoints  = fs.String("endpoints", "", "JSON file of lookup endpoint definitions (see docs)")
		order      = fs.String("order", "key", "output order: key (per-key order, keyed state), input or none (unkeyed enrichment)")
		stats      = fs.Bool("stats", false, "print the run's scheduler, state and lookup metrics as JSON on stderr at the end")
		quiet      = fs.Bool("quiet", false, "no progress bar and no summary")
		noCache    = fs.Bool("no-cache", false, "do not use the on-disk compilation cache")
		recordDir  = fs.String("record", "", "record what the run sees into this new directory, for clink-wasm replay (docs/recording.md;\nit holds input, state values and lookup bodies: the user's data)")
		recordMax  = fs.String("record-max-bytes", "1g", "size cap of the --record directory, e.g. 256m; the run fails when it is reached")
	)
	var endpointFlags []string
	fs.Func("endpoint", "a lookup endpoint as NAME=URL (repeatable; loopback URLs are allowed to reach loopback)", func(v string) error {
		endpointFlags = append(endpointFlags, v)
		return nil
	})
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("run: unexpected argument %q", fs.Arg(0))
	}
	var eps []lookup.EndpointConfig
	if *endpoints != "" {
		list, err := pipeline.LoadEndpoints(*endpoints)
		if err != nil {
			return usagef("run: --endpoints: %v", err)
		}
		eps = list
	}
	for _, v := range endpointFlags {
		c, err := pipeline.ParseEndpointFlag(v)
		if err != nil {
			return usagef("run: --endpoint %s: %v", redactEndpointFlag(v), err)
		}
		eps = append(eps, c)
	}
	orders := map[string]scheduler.Order{"key": scheduler.OrderPerKey, "input": scheduler.OrderInput, "none": scheduler.OrderNone}
	ord, ok := orders[*order]
	if !ok {
		return usagef("run: --order must be key, input or none, not %q", *order)
	}
	if *modPath == "" || *input == "" {
		return usagef("run: --module and --input are required (see clink-wasm run --help)")
	}
	if err := checkRunFlags(fs); err != nil {
		return err
	}
	policy := pipeline.MalformedPolicy(*onBad)
	if policy != pipeline.MalformedFail && policy != pipeline.MalformedSkip {
		return usagef("run: --on-malformed must be fail or skip, not %q", *onBad)
	}
	if *onError != "fail" && *onError != "dead-letter" {
		return usagef("run: --on-error must be fail or dead-letter, not %q", *onError)
	}
	if *onError == "dead-letter" && *deadLetter == "" {
		return usagef("run: --on-error=dead-letter needs --dead-letter FILE")
	}
	if *deadLetter != "" && policy != pipeline.MalformedSkip && *onError != "dead-letter" {
		return usagef("run: --dead-letter needs --on-malformed=skip or --on-error=dead-letter")
	}
	if *retries < 0 || *retries > 10 {
		return usagef("run: --retries must be from 0 to 10, not %d", *retries)
	}
	restoreID, err := pipeline.ParseRestore(*restore)
	if err != nil {
		return usagef("run: %v", err)
	}
	if *stateURL == "" {
		if *stateURL, err = pipeline.StateURLForDir(pipeline.DefaultStateDir); err != nil {
			return err
		}
	} else if u, err := url.Parse(*stateURL); err != nil || (u.Scheme != "file" && u.Scheme != "s3" && u.Scheme != "mem") {
		return usagef("run: --state must be a file:///dir, s3://bucket/prefix or mem:// URL, not %s", pipeline.RedactURL(*stateURL))
	}
	var hot int64
	if *hotBytes != "" {
		if hot, err = pipeline.ParseByteSize(*hotBytes); err != nil {
			return usagef("run: --hot-bytes: %v", err)
		}
		if hot == 0 {
			return usagef("run: --hot-bytes must be > 0 (the hot tier needs room for the keys in flight)")
		}
	}
	if *ckptEvery == 0 {
		*ckptEvery = -1 // only the final checkpoint
	}
	bin, err := os.ReadFile(*modPath)
	if err != nil {
		return fmt.Errorf("reading module: %w", err)
	}
	rec, err := openRecording(fs, *recordDir, *recordMax)
	if err != nil {
		return err
	}
	opts := pipeline.Options{
		Module: bin, KeyField: *key, TimeField: *timeField, WatermarkDelay: *wmDelay,
		OnMalformed: policy, OnError: *onError, Retries: *retries, MaxInFlight: *inFlight, Log: stderr,
		StateURL: *stateURL, HotBytes: hot, Job: *job, Restore: restoreID, CheckpointEvery: *ckptEvery,
		Endpoints: eps, Order: ord,
		Limits: abi.Limits{CallTime: *callTime, MemoryPages: uint32(*memPages)},
		Record: rec, OnCommitPhase: killHook(),
	}
	if rec != nil {
		// Closed with the run's outcome on every path below, so that the recording says how
		// the run ended.
		defer func() {
			if cerr := rec.Close(err); cerr != nil && err == nil {
				err = cerr
			}
		}()
	}
	opts.CacheDir = compileCacheDir(*noCache)
	opts.Format = pipeline.Format(strings.ToLower(*format))
	if opts.Format != "" && opts.Format != pipeline.FormatJSONL && opts.Format != pipeline.FormatCSV {
		return usagef("run: --format must be jsonl or csv, not %q", *format)
	}
	if *input == "-" {
		opts.Input = stdin
	} else {
		f, err := os.Open(*input)
		if err != nil {
			return fmt.Errorf("opening input: %w", err)
		}
		defer f.Close()
		opts.Input = f
		if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
			opts.InputSize = st.Size()
		}
		// The input's identity in checkpoints: a restore skips what the checkpoint covers of
		// this file, and reads another file from its start.
		if abs, err := filepath.Abs(*input); err == nil {
			opts.InputName = abs
		} else {
			opts.InputName = *input
		}
		if opts.Format == "" && strings.EqualFold(filepath.Ext(*input), ".csv") {
			opts.Format = pipeline.FormatCSV
		}
	}
	for flagName, path := range map[string]string{"output": *output, "dead-letter": *deadLetter} {
		if path != "" && *input != "-" && sameFile(path, *input) {
			return usagef("run: --%s %s is the input file: writing it would destroy the input", flagName, path)
		}
	}
	if *output != "" && *deadLetter != "" && (filepath.Clean(*output) == filepath.Clean(*deadLetter) || sameFile(*output, *deadLetter)) {
		return usagef("run: --output and --dead-letter must be different files")
	}
	opts.Output = stdout
	if *output != "" {
		// Not truncated here: the run truncates it to what the restored checkpoint committed
		// (to nothing without a restore), so the committed output is exactly once.
		f, err := os.OpenFile(*output, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return fmt.Errorf("creating output: %w", err)
		}
		defer f.Close()
		opts.Output = f
		if abs, err := filepath.Abs(*output); err == nil {
			opts.OutputName = abs
		} else {
			opts.OutputName = *output
		}
	}
	if *deadLetter != "" {
		// A restore appends: the dead letters before the checkpoint stay (those after it are
		// written again, at least once).
		mode := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
		if restoreID != 0 {
			mode = os.O_WRONLY | os.O_CREATE | os.O_APPEND
		}
		f, err := os.OpenFile(*deadLetter, mode, 0o644)
		if err != nil {
			return fmt.Errorf("creating dead-letter file: %w", err)
		}
		defer f.Close()
		opts.DeadLetter = f
	}
	var bar *progressBar
	if !*quiet && opts.InputSize > 0 && isTerminal(stderr) {
		bar = &progressBar{w: stderr}
		opts.Progress = bar.update
	}
	sum, err := pipeline.Run(ctx, opts)
	if bar != nil {
		bar.clear()
	}
	if !*quiet && sum != nil && sum.Operator != "" && (err == nil || sum.RecordsIn > 0) {
		printSummary(stderr, sum, err)
	}
	if *stats && sum != nil {
		enc := json.NewEncoder(stderr)
		enc.SetIndent("", "  ")
		enc.Encode(struct {
			Scheduler any `json:"scheduler"`
			State     any `json:"state,omitempty"`
			Lookups   any `json:"lookups,omitempty"`
		}{sum.Scheduler, sum.State, sum.Lookups})
	}
	return err
}

// checkRunFlags refuses flag values that have no meaning, rather than defaulting them.
func checkRunFlags(fs *flag.FlagSet) error {
	get := func(name string) flag.Getter { return fs.Lookup(name).Value.(flag.Getter) }
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if n := get("max-in-flight").Get().(int); n < 0 || (set["max-in-flight"] && n == 0) {
		return usagef("run: --max-in-flight must be > 0, not %d (leave it out for the default, 6000)", n)
	}
	if d := get("call-timeout").Get().(time.Duration); d <= 0 {
		return usagef("run: --call-timeout must be > 0, not %v", d)
	}
	if p := get("max-memory-pages").Get().(uint); p == 0 || p > pipeline.MaxMemoryPages {
		return usagef("run: --max-memory-pages must be from 1 to %d (64 KiB pages; 65536 is the wasm32 maximum of 4 GiB), not %d", pipeline.MaxMemoryPages, p)
	}
	if d := get("checkpoint-interval").Get().(time.Duration); d < 0 {
		return usagef("run: --checkpoint-interval must be >= 0, not %v (0 takes only the final checkpoint)", d)
	}
	if d := get("watermark-delay").Get().(time.Duration); d < 0 {
		return usagef("run: --watermark-delay must be >= 0, not %v", d)
	}
	if set["watermark-delay"] && get("time-field").String() == "" {
		return usagef("run: --watermark-delay needs --time-field (without event time the only watermark is the final one)")
	}
	for _, name := range []string{"key", "time-field", "job"} {
		if set[name] && get(name).String() == "" {
			return usagef("run: --%s must not be empty", name)
		}
	}
	return nil
}

// sameFile reports whether paths a and b name one existing file.
func sameFile(a, b string) bool {
	sa, err := os.Stat(a)
	if err != nil {
		return false
	}
	sb, err := os.Stat(b)
	return err == nil && os.SameFile(sa, sb)
}

// redactEndpointFlag hides the password of a NAME=URL flag value before it goes into a message.
func redactEndpointFlag(v string) string {
	name, raw, ok := strings.Cut(v, "=")
	if !ok {
		return v
	}
	if u, err := url.Parse(raw); err == nil {
		return name + "=" + u.Redacted()
	}
	return name + "=(unparsable URL)"
}

func printSummary(w io.Writer, s *pipeline.Summary, err error) {
	status := "done"
	if err != nil {
		status = "failed"
	}
	fmt.Fprintf(w, "%s %s: %d records in, %d out", s.Operator, status, s.RecordsIn, s.RecordsOut)
	if s.Skipped > 0 {
		fmt.Fprintf(w, ", %d malformed skipped", s.Skipped)
	}
	if s.DeadLetters > 0 {
		fmt.Fprintf(w, ", %d dead-lettered (the module faulted)", s.DeadLetters)
	}
	if n := s.Scheduler.RecordRetries; n > 0 {
		fmt.Fprintf(w, ", %d call%s retried", n, plural(int(n)))
	}
	fmt.Fprintf(w, " in %v (%s records/s)\n", s.Duration.Round(time.Millisecond), humanRate(s.RecordsPerSecond()))
	if s.Restored != nil {
		fmt.Fprintf(w, "state: %s\n", s.Restored)
	}
	if n := len(s.Checkpoints); n > 0 {
		fmt.Fprintf(w, "state: checkpoint %d committed (%d checkpoint%s, %s written)", s.Checkpoints[n-1], n, plural(n), humanBytes(s.CheckpointBytes))
		if s.Position != "" {
			fmt.Fprintf(w, "; it covers %s", s.Position)
		}
		if s.Resumable {
			fmt.Fprintln(w, "; resume with --restore latest")
		} else {
			fmt.Fprintln(w, " to process memory (mem://): it ends with this run")
		}
	}
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func humanRate(r float64) string {
	switch {
	case r >= 1e6:
		return fmt.Sprintf("%.2fM", r/1e6)
	case r >= 1e3:
		return fmt.Sprintf("%.1fk", r/1e3)
	}
	return fmt.Sprintf("%.0f", r)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progressBar draws a one-line progress bar on a terminal.
type progressBar struct {
	w     io.Writer
	drawn bool
}

func (b *progressBar) update(p pipeline.Progress) {
	frac := 0.0
	if p.InputSize > 0 {
		frac = min(1, float64(p.BytesRead)/float64(p.InputSize))
	}
	const width = 30
	n := int(frac * width)
	rate := 0.0
	if p.Elapsed > 0 {
		rate = float64(p.RecordsIn) / p.Elapsed.Seconds()
	}
	fmt.Fprintf(b.w, "\r[%s%s] %3.0f%%  %d records  %s/s  ", strings.Repeat("=", n), strings.Repeat(" ", width-n),
		frac*100, p.RecordsIn, humanRate(rate))
	b.drawn = true
}

func (b *progressBar) clear() {
	if b.drawn {
		fmt.Fprintf(b.w, "\r%s\r", strings.Repeat(" ", 79))
	}
}
