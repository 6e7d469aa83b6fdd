package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/clink-wasm/clink-wasm/host/connector/file"
	"github.com/clink-wasm/clink-wasm/host/connector/gen"
	webhook "github.com/clink-wasm/clink-wasm/host/connector/http"
	"github.com/clink-wasm/clink-wasm/host/connector/kafka"
	"github.com/clink-wasm/clink-wasm/host/connector/stdout"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
	"github.com/spf13/cobra"
)

// Exit statuses of the cobra commands (serve, module, tenant, completion). Scripts may rely on
// them; the flag commands (run, inspect) keep 0, 1 and 2.
const (
	exitOK          = 0
	exitFailure     = 1 // anything else: a server error, a local IO error
	exitUsage       = 2 // the command line is wrong
	exitAuth        = 4 // 401/403: no token, a wrong one, or not allowed
	exitNotFound    = 5 // 404
	exitConflict    = 6 // 409: exists already, or in use
	exitInvalid     = 7 // 400/413/415/422: the request or the module was refused as invalid
	exitUnavailable = 8 // 429/501/503: rate limited, not in this build, or not ready; try later
	exitUnreachable = 9 // the server could not be reached
)

const exitCodesHelp = `Exit status: 0 success, 1 failure, 2 usage error, 4 not authenticated or not
allowed, 5 not found, 6 conflict or in use, 7 refused as invalid (the problems are printed),
8 rate limited or unavailable (retry later), 9 server unreachable.`

// exitError carries an exit status up to cobraMain.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// cobraMain runs the cobra commands; it returns the exit status.
func cobraMain(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRoot(ctx, stdin, stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(stderr, "clink-wasm:", err)
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	// cobra's own errors (unknown flag, wrong argument count) are usage errors.
	return exitUsage
}

func newRoot(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "clink-wasm",
		Short:         "clink-wasm runs user-defined stream operators compiled to WebAssembly",
		Long:          "clink-wasm runs user-defined stream operators compiled to WebAssembly.\n\n" + exitCodesHelp,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(newServeCmd(), newModuleCmd(), newTenantCmd(), newPipelineCmd())
	// The flag commands, so that help and shell completion list them; main dispatches them
	// itself (they are not cobra commands this release).
	for _, c := range []struct{ name, short string }{
		{"run", "run a bounded local pipeline over a file of JSON Lines or CSV records"},
		{"inspect", "print a module's ABI version, capabilities, imports, exports and problems"},
		{"manifest", "put a manifest in a module's clink.manifest custom section"},
		{"version", "print the version"},
	} {
		root.AddCommand(&cobra.Command{
			Use: c.name, Short: c.short, DisableFlagParsing: true,
			RunE: func(cmd *cobra.Command, args []string) error {
				code := run(ctx, append([]string{c.name}, args...), stdin, stdout, stderr)
				if code != 0 {
					return &exitError{code: code, err: fmt.Errorf("%s failed", c.name)}
				}
				return nil
			},
		})
	}
	return root
}

// compileCacheDir is the on-disk compilation cache shared by every command that runs modules
// ("" when disabled with --no-cache or when the user has no cache directory).
func compileCacheDir(noCache bool) string {
	if noCache {
		return ""
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "clink-wasm", "wazero")
}

// readSpec reads and validates the pipeline spec at path; its errors name the file.
func readSpec(path string) (*pipeline.Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the pipeline spec: %w", err)
	}
	spec, err := pipeline.ParseSpec(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return spec, nil
}

// allConnectors is the connector set of `run --pipeline` and `worker`: files, Kafka, the
// generator, webhooks and stdout (writing to out).
func allConnectors(out io.Writer) *pipeline.Connectors {
	conns := &pipeline.Connectors{}
	file.Register(conns)
	kafka.Register(conns)
	gen.Register(conns)
	webhook.Register(conns)
	stdout.Register(conns, out)
	return conns
}

// runtimeLog logs the runtime's events on stderr: warnings, or everything with -v.
func runtimeLog(stderr io.Writer, verbose bool) *slog.Logger {
	level := slog.LevelWarn
	if verbose {
		level = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
}
