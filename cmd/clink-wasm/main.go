// Command clink-wasm runs WebAssembly stream operators.
//
//	clink-wasm run --module OP.wasm --input FILE [--key FIELD] [flags]
//	clink-wasm inspect OP.wasm
//	clink-wasm manifest embed --manifest M.json IN.wasm [-o OUT.wasm]
//
// Exit status: 0 on success, 1 when a pipeline or module fails, 2 on a usage error.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"syscall"
	"time"
)

const usage = `clink-wasm runs user-defined stream operators compiled to WebAssembly.

Usage:
  clink-wasm run --module OP.wasm --input FILE [--key FIELD] [flags]
        run a bounded local pipeline over a file of JSON Lines or CSV records
  clink-wasm replay DIR --module NEW.wasm [--json]
        run a module against a recording (run --record DIR): no network, no state tier
  clink-wasm inspect OP.wasm
        print a module's ABI version, capabilities, imports, exports and problems
  clink-wasm manifest embed --manifest MANIFEST.json IN.wasm [-o OUT.wasm]
        put a manifest in a module's clink.manifest custom section
  clink-wasm new --lang go|as|c|rust NAME
        create an operator project NAME that builds and tests at once
  clink-wasm build
        in a project: compile it, embed its manifest, report what inspect would
  clink-wasm test [--table FILE] [--module M.wasm]
        in a project: run its tests.json against the module in the production host
  clink-wasm serve [--listen ADDR] [--data URL]
        run the multi-tenant REST API and web console (default 127.0.0.1:8080, .clink/server)
  clink-wasm module push|ls|get|rm   tenant create|ls|quota   pipeline create|ls|get|rm|start|stop|savepoint
        client commands for a server (--server/CLINK_SERVER, --token/CLINK_TOKEN)
  clink-wasm completion bash|zsh|fish|powershell
  clink-wasm worker --pipeline SPEC.yaml --state s3://BUCKET/PREFIX [flags]
        one of several workers sharing a Kafka pipeline's partitions (docs/SCALING.md)
  clink-wasm dev kafka [--port N] [--topic NAME:PARTITIONS]...
        run a Kafka cluster (kfake) on loopback to try Kafka pipelines on one machine
  clink-wasm version

Run "clink-wasm COMMAND --help" for a command's flags.
`

// errUsage marks errors that are the caller's mistake in invoking a command (exit status 2).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

func main() { os.Exit(mainCode()) }

// mainCode is main up to the exit: the command, under the signals that stop it, and the
// profiles the environment asks for. The tests' child processes run it too.
func mainCode() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	endProfiles := startProfiles(os.Stderr)
	defer endProfiles()
	return run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
}

// startProfiles writes Go profiles of the whole command for diagnosis, when the environment
// asks: CLINK_CPUPROFILE=FILE (CPU, from start to exit) and CLINK_MEMPROFILE=FILE (the heap
// as of the collection that found the most live bytes so far, checked every 250 ms: where the
// peak's memory was; a run shorter than that gets the heap at its end). It returns what ends
// them.
func startProfiles(stderr io.Writer) func() {
	warn := func(err error) { fmt.Fprintf(stderr, "clink-wasm: profile: %v\n", err) }
	var stops []func()
	if path := os.Getenv("CLINK_CPUPROFILE"); path != "" {
		if f, err := os.Create(path); err != nil {
			warn(err)
		} else if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			warn(err)
		} else {
			stops = append(stops, func() { pprof.StopCPUProfile(); f.Close() })
		}
	}
	if path := os.Getenv("CLINK_MEMPROFILE"); path != "" {
		done, exited := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(exited)
			live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
			var peak uint64
			t := time.NewTicker(250 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-done:
					if peak == 0 { // a run too short for a tick: the heap at its end
						if err := writeHeapProfile(path); err != nil {
							warn(err)
						}
					}
					return
				case <-t.C:
				}
				metrics.Read(live)
				if v := live[0].Value.Uint64(); v > peak+peak/10 {
					peak = v
					if err := writeHeapProfile(path); err != nil {
						warn(err)
						return
					}
				}
			}
		}()
		stops = append(stops, func() { close(done); <-exited })
	}
	return func() {
		for _, stop := range stops {
			stop()
		}
	}
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// run is main without the process: it returns the exit status.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) (code int) {
	defer func() {
		// A bug in clink-wasm must not show users a Go panic trace: say what happened and
		// where to report it. (Guest faults never get here; they are ordinary errors.)
		if r := recover(); r != nil {
			fmt.Fprintf(stderr, "clink-wasm: internal error: %v\nplease report this with the command you ran\n", r)
			if os.Getenv("CLINK_DEBUG") != "" {
				stderr.Write(debug.Stack())
			}
			code = 3
		}
	}()
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "run":
		err = cmdRun(ctx, args[1:], stdin, stdout, stderr)
	case "replay":
		err = cmdReplay(ctx, args[1:], stdout, stderr)
	case "inspect":
		err = cmdInspect(ctx, args[1:], stdout, stderr)
	case "manifest":
		err = cmdManifest(args[1:], stdout, stderr)
	case "new":
		err = cmdNew(args[1:], stdout, stderr)
	case "build":
		err = cmdBuild(ctx, args[1:], stdout, stderr)
	case "test":
		err = cmdTest(ctx, args[1:], stdout, stderr)
	case "serve", "module", "tenant", "pipeline", "completion", "__complete", "__completeNoDesc":
		return cobraMain(ctx, args, stdin, stdout, stderr)
	case "dev":
		err = cmdDev(ctx, args[1:], stdout, stderr)
	case "worker":
		err = cmdWorker(ctx, args[1:], stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, "clink-wasm", version())
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		err = usagef("unknown command %q\n\n%s", args[0], usage)
	}
	var ue *usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, "clink-wasm:", err)
		return 2
	default:
		fmt.Fprintln(stderr, "clink-wasm:", err)
		return 1
	}
}

var errHelp = errors.New("help requested")

func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}
