package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/clink-wasm/clink-wasm/host/devkit"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
	"github.com/clink-wasm/clink-wasm/host/replay"
)

// openRecording creates the --record recorder, or returns nil without --record.
func openRecording(fs *flag.FlagSet, dir, maxBytes string) (*replay.Recorder, error) {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == "record-max-bytes" })
	if dir == "" {
		if set {
			return nil, usagef("run: --record-max-bytes needs --record DIR")
		}
		return nil, nil
	}
	n, err := pipeline.ParseByteSize(maxBytes)
	if err != nil || n <= 0 {
		return nil, usagef("run: --record-max-bytes must be a size > 0 such as 256m or 1g, not %q", maxBytes)
	}
	rec, err := replay.Create(dir, replay.RecorderOptions{MaxBytes: n})
	if err != nil {
		return nil, usagef("run: --record: %v", err)
	}
	return rec, nil
}

// errDiverged is the replay's failure when the module did not reproduce the recording (exit 1).
var errDiverged = errors.New("the replay differs from the recording")

func cmdReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("replay", "replay DIR --module NEW.wasm [--json]", stderr)
	var (
		modPath  = fs.String("module", "", "the module to replay the recording with (.wasm)")
		asJSON   = fs.Bool("json", false, "print the report as JSON on stdout")
		details  = fs.Int("max-details", 20, "differences described one by one (all are counted), > 0")
		logs     = fs.Bool("logs", false, "show the guest's log lines on stderr")
		noCache  = fs.Bool("no-cache", false, "do not use the on-disk compilation cache")
		casesOut = fs.String("cases", "", "instead of replaying, write the recording as a clink-wasm test table (tests.json format) to this file (- for stdout)")
	)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("replay: give one recording directory (see clink-wasm replay --help)")
	}
	dir := pos[0]
	if *casesOut != "" {
		return writeCases(dir, *casesOut, stdout)
	}
	if *modPath == "" {
		return usagef("replay: --module NEW.wasm is required")
	}
	if *details <= 0 {
		return usagef("replay: --max-details must be > 0, not %d", *details)
	}
	bin, err := os.ReadFile(*modPath)
	if err != nil {
		return fmt.Errorf("reading module: %w", err)
	}
	opts := replay.Options{Module: bin, MaxDetails: *details}
	if *logs {
		opts.Log = stderr
	}
	opts.CacheDir = compileCacheDir(*noCache)
	rep, err := replay.Run(ctx, dir, opts)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(struct {
			*replay.Report
			Identical bool `json:"identical"`
		}{rep, rep.Identical()}); err != nil {
			return err
		}
	} else {
		printReplay(stdout, rep)
	}
	if !rep.Identical() {
		return errDiverged
	}
	return nil
}

func printReplay(w io.Writer, r *replay.Report) {
	fmt.Fprintf(w, "replayed %s: %d record%s, %d watermark%s\n", r.Dir, r.Records, plural(int(r.Records)), r.Watermarks, plural(int(r.Watermarks)))
	fmt.Fprintf(w, "  recorded with %s (sha256 %.12s), replayed with %s (sha256 %.12s)\n",
		r.Recorded.Operator, r.Recorded.SHA256, r.Replayed.Operator, r.Replayed.SHA256)
	fmt.Fprintf(w, "  outputs: %d recorded, %d replayed\n", r.ExpectedOutputs, r.GotOutputs)
	if r.Identical() {
		fmt.Fprintln(w, "identical: every record and timer produced the recorded outputs")
		return
	}
	if r.Error != "" {
		fmt.Fprintf(w, "the replayed module failed: %s\n", r.Error)
	}
	if r.Differing > 0 {
		fmt.Fprintf(w, "%d record%s or timer%s differ", r.Differing, plural(int(r.Differing)), plural(int(r.Differing)))
		if n := int64(len(r.Diffs)); n < r.Differing {
			fmt.Fprintf(w, " (the first %d shown; --max-details shows more)", n)
		}
		fmt.Fprintln(w, ":")
		for _, d := range r.Diffs {
			fmt.Fprintf(w, "  %s", d.Source.Describe)
			if !d.Source.Outside {
				fmt.Fprintf(w, " (key %s", showBytes(d.Source.Key))
				if d.Source.GotKey != nil {
					fmt.Fprintf(w, ", keyed %s by the replayed module", showBytes(d.Source.GotKey))
				}
				fmt.Fprint(w, ")")
			}
			fmt.Fprintln(w)
			printOutValues(w, "expected", d.Expected)
			printOutValues(w, "got     ", d.Got)
		}
	}
	if r.Unrecorded > 0 {
		fmt.Fprintf(w, "%d read%s or lookups are not in the recording (answered as absent / LOOKUP_UNAVAILABLE, nothing was sent):\n", r.Unrecorded, plural(int(r.Unrecorded)))
		for _, u := range r.UnrecordedReads {
			fmt.Fprintf(w, "  state %q key %s", u.State, showBytes(u.Key))
			if len(u.Entry) > 0 {
				fmt.Fprintf(w, " entry %s", showBytes(u.Entry))
			}
			fmt.Fprintln(w)
		}
		for _, u := range r.UnrecordedLookups {
			fmt.Fprintf(w, "  lookup on %q: %s\n", u.Endpoint, showBytes(u.Request))
		}
	}
}

func printOutValues(w io.Writer, label string, vs []replay.OutValue) {
	if len(vs) == 0 {
		fmt.Fprintf(w, "    %s: (no output)\n", label)
		return
	}
	for i, v := range vs {
		if i > 0 {
			label = "        "
		}
		fmt.Fprintf(w, "    %s: %s\n", label, showBytes(v.Value))
	}
}

// showBytes prints text as it is (quoted when empty, or when it has spaces or control bytes
// that would make the line ambiguous), other bytes as hex.
func showBytes(b []byte) string {
	if !utf8.Valid(b) {
		return fmt.Sprintf("0x%x", b)
	}
	s := string(b)
	if s == "" || strings.ContainsFunc(s, func(r rune) bool { return unicode.IsControl(r) || (r == ' ' && s[0] != '{' && s[0] != '[') }) {
		return strconv.Quote(s)
	}
	return s
}

func writeCases(dir, out string, stdout io.Writer) error {
	cases, err := devkit.FromRecording(dir)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(cases, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if out == "-" {
		_, err = stdout.Write(b)
		return err
	}
	return os.WriteFile(out, b, 0o600)
}
