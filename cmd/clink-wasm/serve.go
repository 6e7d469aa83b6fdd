package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/clink-wasm/clink-wasm/host/control"
	"github.com/clink-wasm/clink-wasm/host/server"
	"github.com/clink-wasm/clink-wasm/web"
)

func newServeCmd() *cobra.Command {
	var (
		listen, data, logFormat, logLevel string
		maxModule, maxLag                 int64
		runDir, kafkaSecrets              string
		fixedShares                       bool
		cpuBudget                         int64
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "run the multi-tenant REST API and web console",
		Long: `Run the hosted platform: the REST API under /api/v1, /metrics, /openapi.json and the web
console at /. With no flags it keeps its records under .clink/server (file://) and listens on
127.0.0.1:8080.

It runs the tenants' pipelines in process: each one's state under --data (state/<tenant>/<id>),
its ingest log and preview output under --run-dir. A pipeline that was running when the server
stopped (or was killed) resumes from its last checkpoint when the server starts again.

On first start it creates the admin token and prints it once on stderr; only its hash is
stored. CLINK_ADMIN_TOKEN sets the admin token instead (for scripts and tests).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return &exitError{exitUsage, fmt.Errorf("--log-level: %w", err)}
			}
			opts := &slog.HandlerOptions{Level: level}
			var h slog.Handler
			switch logFormat {
			case "json":
				h = slog.NewJSONHandler(cmd.ErrOrStderr(), opts)
			case "text":
				h = slog.NewTextHandler(cmd.ErrOrStderr(), opts)
			default:
				return &exitError{exitUsage, fmt.Errorf("--log-format must be json or text, not %q", logFormat)}
			}
			log := slog.New(h)
			store, err := control.OpenStore(ctx, data, control.S3Options{})
			if err != nil {
				return &exitError{exitUsage, err}
			}
			defer store.Close()
			ctl, err := control.Open(ctx, store)
			if err != nil {
				return &exitError{exitFailure, err}
			}
			cfg := server.Config{
				MaxModuleBytes: maxModule, AdminToken: os.Getenv("CLINK_ADMIN_TOKEN"), Logger: log, Console: web.Dist(),
				DataURL: data, RunDir: runDir, MaxIngestLagBytes: maxLag, FixedCPUShares: fixedShares,
				GuestCPUBudget: cpuBudget,
			}
			if kafkaSecrets != "" {
				if cfg.KafkaSecrets, err = server.SecretsFromFile(kafkaSecrets); err != nil {
					return &exitError{exitUsage, fmt.Errorf("--kafka-secrets: %w", err)}
				}
			}
			srv, created, err := server.New(ctx, ctl, cfg)
			if err != nil {
				return &exitError{exitFailure, err}
			}
			defer srv.Close(ctx)
			if created != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "\n  admin token (shown once; only its hash is stored):\n\n    %s\n\n", created)
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return &exitError{exitFailure, fmt.Errorf("listening on %s: %w", listen, err)}
			}
			log.Info("listening", "addr", ln.Addr().String(), "data", data, "console", "http://"+consoleHost(ln.Addr().String())+"/")
			err = srv.Serve(ctx, ln)
			log.Info("stopped")
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", server.DefaultListen, "address to listen on (host:port; port 0 picks a free one)")
	f.StringVar(&data, "data", server.DefaultDataDir, "where the control plane keeps its records: a directory, file:///dir or s3://bucket/prefix?endpoint=...")
	f.Int64Var(&maxModule, "max-module-bytes", server.DefaultMaxModuleSize, "largest module upload accepted (a tenant's quota may be lower)")
	f.StringVar(&runDir, "run-dir", "", "local directory of the pipelines' ingest logs and preview outputs (default: run/ under a local --data, else .clink/run)")
	f.Int64Var(&maxLag, "max-ingest-lag-bytes", 64<<20, "how far ingest may run ahead of a pipeline before POST …/records answers 429")
	f.StringVar(&kafkaSecrets, "kafka-secrets", "", "JSON file of per-tenant secrets for Kafka SASL ({\"TENANT\": {\"NAME\": \"VALUE\"}}); a spec names them in sasl.username_env/password_env")
	f.BoolVar(&fixedShares, "fixed-cpu-shares", false, "keep the tenants' guest CPU shares at their guest_cpu_millicores quotas even when the host gets less CPU than it has cores (by default they shrink with the pressure on the server's threads)")
	f.Int64Var(&cpuBudget, "guest-cpu-budget", 0, "millicores the guest_cpu_millicores quotas of the tenants running pipelines may sum to; a start or quota raise beyond it is refused (0: the host's cores, GOMAXPROCS × 1000; -1: no check, overcommit allowed)")
	f.StringVar(&logFormat, "log-format", "json", "log format: json or text")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	return cmd
}

func consoleHost(addr string) string {
	if strings.HasPrefix(addr, "0.0.0.0:") || strings.HasPrefix(addr, "[::]:") {
		_, port, _ := net.SplitHostPort(addr)
		return "127.0.0.1:" + port
	}
	return addr
}
