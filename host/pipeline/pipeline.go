// Package pipeline is the pipeline runtime: specs of sources, keyed Wasm operators and sinks
// (Start), and the flag form of `clink-wasm run` (Run), a one-operator spec over an input
// file and a JSON Lines output.
package pipeline

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/lookup"
	"github.com/clink-wasm/clink-wasm/host/replay"
	"github.com/clink-wasm/clink-wasm/host/scheduler"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// Options configures a run. Zero values mean defaults.
type Options struct {
	// Module is the operator's .wasm bytes.
	Module []byte

	Input     io.Reader
	InputSize int64 // for progress; 0 if unknown
	// InputName identifies the input in checkpoints (its path; default "input"). A restore
	// skips what the checkpoint covers of the input of this name, and reads an input of
	// another name from its start.
	InputName string
	Format    Format

	// KeyField keys records by a top-level field of the JSON value (or CSV column). When empty
	// and the module exports clink_key, the guest keys records; otherwise every record has the
	// empty key.
	KeyField string
	// TimeField takes event time from a field (epoch ms or RFC 3339); otherwise records carry
	// ingestion time and the only watermark is the final one.
	TimeField      string
	WatermarkDelay time.Duration // bounded out-of-orderness
	WatermarkEvery int           // records between watermarks (default 1000)

	OnMalformed MalformedPolicy
	DeadLetter  io.Writer
	// OnError is what a guest fault on a record does (a spec's on_error): "fail" (the default)
	// fails the run; "dead-letter" writes the record to DeadLetter (required then) as
	// {"line", "operator", "key", "attempts", "reason", "raw"} and goes on. Retries runs such a
	// record again up to this many times (0-10) first (a spec's retries).
	OnError string
	Retries int

	Output io.Writer
	// OutputName, when set and Output is a regular file, makes the output exactly once: it
	// names the file in checkpoints, and a run truncates it to what the restored checkpoint
	// committed (to nothing without a restore) before writing.
	OutputName string
	Log        io.Writer // guest logs; nil discards

	Limits      abi.Limits
	MaxInFlight int
	CacheDir    string // wazero compilation cache; "" keeps it in memory

	// StateURL names the durable state pool (file://, s3://, mem://). Empty with a nil Backend
	// keeps state in process memory, without checkpoints.
	StateURL string
	// Job is the operator's stable identity in the state pool (default: the module's name).
	Job string
	// Restore is the checkpoint to restore: 0 starts empty, state.RestoreLatest the newest (an
	// error wrapping ErrNoCheckpoint if there is none), RestoreLatestIfAny the newest if there
	// is one. A checkpoint records the module that wrote it: another module may restore it only
	// if they share a state name (an upgrade, reported in Summary.Restored); otherwise the run
	// fails with ErrModuleMismatch.
	Restore uint64
	// HotBytes bounds the durable pool's hot tier (state.WithHotBytes; it overrides the URL's
	// hot_bytes). 0 keeps the pool's default.
	HotBytes int64
	// CheckpointEvery takes a checkpoint after this much time (default 10s; <0 only the final
	// one). With a durable pool, a final checkpoint is always taken at the end of the input.
	CheckpointEvery time.Duration
	// Endpoints are the pipeline's named HTTP endpoints, opened through Registry (a private
	// one if nil).
	Endpoints []lookup.EndpointConfig
	Registry  *lookup.Registry
	// Order is the output order guarantee (default per key). Input and none are for unkeyed
	// enrichment: records run concurrently and keyed state is not available.
	Order scheduler.Order

	// Record, if set, records what the run sees (host/replay, docs/recording.md). The caller
	// creates it and closes it with the run's error; a recording that fails (its size cap)
	// fails the run.
	Record *replay.Recorder

	// OnCommitPhase, if set, is called at each step of a checkpoint commit (fault injection,
	// as Env.OnCommitPhase).
	OnCommitPhase func(phase CommitPhase, checkpoint uint64) error

	// Progress, if set, is called about five times a second while the run lasts.
	Progress func(Progress)
}

// Progress is a snapshot of a running pipeline.
type Progress struct {
	BytesRead, InputSize int64
	RecordsIn, Outputs   int64
	Elapsed              time.Duration
}

// Summary reports a finished run.
type Summary struct {
	Operator   string
	RecordsIn  int64
	RecordsOut int64
	Skipped    int64
	// DeadLetters counts the records whose guest call faulted and that went to the
	// dead-letter output (Options.OnError "dead-letter").
	DeadLetters int64
	Duration    time.Duration
	Scheduler   scheduler.Snapshot
	MaxInFlight int

	// Checkpoints are the checkpoints made durable during the run, the last one final.
	Checkpoints     []uint64
	CheckpointBytes int64
	State           *state.Metrics // durable pools only
	// Resumable says whether the checkpoints outlive the process (not a mem:// pool).
	Resumable bool
	// Position says which input position the last checkpoint covers.
	Position string
	// Restored says what was restored; nil without Options.Restore.
	Restored *RestoreInfo
	// Lookups are the metrics of each endpoint.
	Lookups map[string]lookup.Metrics
}

// RecordsPerSecond is the input throughput of the run.
func (s *Summary) RecordsPerSecond() float64 {
	if s.Duration <= 0 {
		return 0
	}
	return float64(s.RecordsIn) / s.Duration.Seconds()
}

// ErrOrderWithState refuses a module that declares keyed state under an order other than per
// key: keyed state is not available there (nothing orders two records of a key).
var ErrOrderWithState = errors.New("keyed state needs per-key order")

func orderFlagName(o scheduler.Order) string {
	switch o {
	case scheduler.OrderPerKey:
		return "key"
	case scheduler.OrderInput:
		return "input"
	case scheduler.OrderNone:
		return "none"
	}
	return fmt.Sprintf("Order(%d)", o)
}

// validate refuses option values that have no meaning (zero values are defaults).
func (o *Options) validate() error {
	switch {
	case o.Format != FormatJSONL && o.Format != FormatCSV:
		return fmt.Errorf("unknown input format %q (use jsonl or csv)", o.Format)
	case o.OnMalformed != MalformedFail && o.OnMalformed != MalformedSkip:
		return fmt.Errorf("unknown malformed-record policy %q (use fail or skip)", o.OnMalformed)
	case o.OnError != "" && o.OnError != "fail" && o.OnError != "dead-letter":
		return fmt.Errorf("unknown on-error policy %q (use fail or dead-letter)", o.OnError)
	case o.OnError == "dead-letter" && o.DeadLetter == nil:
		return errors.New("on-error dead-letter needs a dead-letter output")
	case o.Retries < 0 || o.Retries > 10:
		return fmt.Errorf("retries must be in [0, 10], not %d", o.Retries)
	case o.MaxInFlight < 0:
		return fmt.Errorf("max in flight must be > 0 (or 0 for the default), not %d", o.MaxInFlight)
	case o.Limits.CallTime < 0:
		return fmt.Errorf("call time limit must be > 0 (or 0 for the default), not %v", o.Limits.CallTime)
	case o.Limits.MemoryPages > MaxMemoryPages:
		return fmt.Errorf("memory limit of %d pages exceeds the wasm32 maximum of %d (4 GiB)", o.Limits.MemoryPages, MaxMemoryPages)
	case o.HotBytes < 0:
		return fmt.Errorf("hot bytes must be > 0 (or 0 for the pool's default), not %d", o.HotBytes)
	case o.WatermarkDelay < 0:
		return fmt.Errorf("watermark delay must be >= 0, not %v", o.WatermarkDelay)
	case o.WatermarkEvery < 0:
		return fmt.Errorf("records between watermarks must be > 0 (or 0 for the default), not %d", o.WatermarkEvery)
	case o.Order > scheduler.OrderNone:
		return fmt.Errorf("unknown output order %d", o.Order)
	}
	l := o.Limits
	for _, f := range []struct {
		name string
		v    int
	}{{"record key", l.MaxRecordKey}, {"record value", l.MaxRecordValue}, {"state key", l.MaxStateKey}, {"state value", l.MaxStateValue},
		{"emitted value", l.MaxEmitValue}, {"emits per call", l.MaxEmitsPerCall}, {"lookup request", l.MaxLookupRequest},
		{"log message", l.MaxLogMessage}, {"prefetch value", l.MaxPrefetchValue}} {
		if f.v < 0 {
			return fmt.Errorf("%s limit must be > 0 (or 0 for the default), not %d", f.name, f.v)
		}
	}
	return nil
}

// MaxMemoryPages is the wasm32 maximum of linear memory, in 64 KiB pages (4 GiB).
const MaxMemoryPages = 65536

// redactURL drops the credentials a state URL might carry before it goes into a message: the
// password of its own userinfo, and that of any URL in its query (an S3 endpoint such as
// endpoint=http://user:pass@host).
func redactURL(s string) string { return secretReplacer(s).Replace(s) }

// RedactURL returns a state URL fit for a message: without the credentials it may carry.
func RedactURL(s string) string { return redactURL(s) }

// redactErr returns err with the credentials of rawURL taken out of its text. Errors from the
// state tier and the S3 client can quote the URL or the endpoint; errors.Is and errors.As
// still see through it.
func redactErr(err error, rawURL string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if red := secretReplacer(rawURL).Replace(msg); red != msg {
		return &redactedError{msg: red, err: err}
	}
	return err
}

type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// secretReplacer replaces, in any text, the credentials that rawURL carries with "xxxxx".
func secretReplacer(rawURL string) *strings.Replacer {
	u, err := url.Parse(rawURL)
	if err != nil {
		return strings.NewReplacer(rawURL, "(unparsable URL)")
	}
	var pairs []string
	userinfo := func(ui *url.Userinfo) {
		pass, ok := ui.Password()
		if !ok {
			return
		}
		name := ui.Username()
		red := url.UserPassword(name, "xxxxx").String() + "@"
		for _, old := range []string{ui.String() + "@", name + ":" + pass + "@"} {
			pairs = append(pairs, old, red, url.QueryEscape(old), url.QueryEscape(red))
		}
		if len(pass) >= 6 { // long enough not to be found by accident in the message's own words
			pairs = append(pairs, pass, "xxxxx", url.QueryEscape(pass), "xxxxx")
		}
	}
	if u.User != nil {
		userinfo(u.User)
	}
	for _, vs := range u.Query() {
		for _, v := range vs {
			if vu, err := url.Parse(v); err == nil && vu.User != nil {
				userinfo(vu.User)
			}
		}
	}
	return strings.NewReplacer(pairs...)
}

// lookupLogger logs the endpoints' refusals (naming the rule) and breaker changes to the run's
// log writer, beside the guest's own log lines.
func lookupLogger(w io.Writer) *slog.Logger {
	if w == nil {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}
