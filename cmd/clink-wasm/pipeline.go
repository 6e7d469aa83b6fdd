package main

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/clink-wasm/clink-wasm/host/server"
)

func newPipelineCmd() *cobra.Command {
	var f clientFlags
	cmd := &cobra.Command{Use: "pipeline", Short: "create, list, show and remove pipelines on a server"}
	addClientFlags(cmd, &f)

	var specFile string
	create := &cobra.Command{
		Use:   "create NAME -f SPEC.json",
		Short: "store a pipeline from its spec (modules by id, NAME@VERSION or NAME)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if specFile == "" {
				return &exitError{exitUsage, fmt.Errorf("pipeline create: give the spec with -f SPEC.json")}
			}
			spec, err := os.ReadFile(specFile)
			if err != nil {
				return &exitError{exitFailure, err}
			}
			if !json.Valid(spec) {
				return &exitError{exitInvalid, fmt.Errorf("%s is not valid JSON", specFile)}
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			body, _ := json.Marshal(map[string]any{"name": args[0], "spec": json.RawMessage(spec)})
			var p server.PipelineView
			if err := c.call(cmd.Context(), "POST", "/api/v1/pipelines", nil, "application/json", body, &p); err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), p)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "created pipeline %s (%s): %d subtask(s), state %s\n", p.Name, p.ID, p.Subtasks, p.State)
			return nil
		},
	}
	create.Flags().StringVarP(&specFile, "file", "f", "", "the pipeline spec (JSON)")

	ls := &cobra.Command{
		Use:   "ls",
		Short: "list pipelines",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			all, err := listAll[server.PipelineView](cmd.Context(), c, "/api/v1/pipelines", nil)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), all)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tID\tSTATE\tREVISION\tSUBTASKS\tCHECKPOINT\tUPDATED")
			for _, p := range all {
				cp := "-"
				if p.Checkpoint != nil {
					cp = fmt.Sprint(p.Checkpoint.ID)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\n", p.Name, p.ID, p.State, p.Revision, p.Subtasks, cp, p.UpdatedAt.Format("2006-01-02 15:04"))
			}
			return tw.Flush()
		},
	}

	get := &cobra.Command{
		Use:   "get ID",
		Short: "show a pipeline record with its spec",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			var p server.PipelineView
			if err := c.call(cmd.Context(), "GET", "/api/v1/pipelines/"+url.PathEscape(args[0]), nil, "", nil, &p); err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), p)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "pipeline:   %s (%s)\nstate:      %s\nrevision:   %d\nsubtasks:   %d\nmodules:    %s\n", p.Name, p.ID, p.State, p.Revision, p.Subtasks, orDash(p.Modules))
			if p.Checkpoint != nil {
				fmt.Fprintf(w, "checkpoint: %d at %s (%s)\n", p.Checkpoint.ID, p.Checkpoint.At.Format("2006-01-02 15:04:05"), p.Checkpoint.URL)
			}
			fmt.Fprintln(w, "spec:")
			var v any
			_ = json.Unmarshal(p.Spec, &v)
			b, _ := json.MarshalIndent(v, "  ", "  ")
			fmt.Fprintf(w, "  %s\n", b)
			return nil
		},
	}

	rm := &cobra.Command{
		Use:   "rm ID",
		Short: "remove a pipeline record",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			if err := c.call(cmd.Context(), "DELETE", "/api/v1/pipelines/"+url.PathEscape(args[0]), nil, "", nil, nil); err != nil {
				return err
			}
			if !f.json {
				fmt.Fprintf(cmd.OutOrStdout(), "removed %s\n", args[0])
			}
			return nil
		},
	}
	cmd.AddCommand(create, ls, get, rm)

	// The run-time actions go to the server, which says whether this build can run pipelines.
	for _, a := range []struct{ use, route, short string }{
		{"start", "start", "start a pipeline"},
		{"stop", "stop", "stop a pipeline"},
		{"savepoint", "savepoints", "take a savepoint"},
	} {
		var savepoint bool
		sub := &cobra.Command{
			Use: a.use + " ID", Short: a.short, Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := f.client()
				if err != nil {
					return err
				}
				body := []byte("{}")
				if savepoint {
					body = []byte(`{"savepoint":true}`)
				}
				var out map[string]any
				if err := c.call(cmd.Context(), "POST", "/api/v1/pipelines/"+url.PathEscape(args[0])+"/"+a.route, nil, "application/json", body, &out); err != nil {
					return err
				}
				return printJSON(cmd.OutOrStdout(), out)
			},
		}
		if a.use == "stop" {
			sub.Flags().BoolVar(&savepoint, "savepoint", false, "take a final savepoint before stopping")
		}
		cmd.AddCommand(sub)
	}
	var (
		follow bool
		limit  int
	)
	output := &cobra.Command{
		Use: "output ID", Short: "print the preview sink's latest committed outputs (JSON Lines); --follow streams them", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			q := url.Values{"limit": {strconv.Itoa(limit)}}
			if follow {
				q.Set("follow", "1")
				c.hc.Timeout = 0
			}
			return c.callStream(cmd.Context(), "GET", "/api/v1/pipelines/"+url.PathEscape(args[0])+"/output", q, "", nil, nil, cmd.OutOrStdout())
		},
	}
	output.Flags().BoolVar(&follow, "follow", false, "keep streaming outputs as checkpoints commit them (until interrupted)")
	output.Flags().IntVar(&limit, "limit", 100, "how many of the latest outputs (1-1000)")
	logs := &cobra.Command{
		Use: "logs ID", Short: "print the pipeline's recent errors (operator, key, record)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			var out struct {
				Error string `json:"error"`
				Items []struct {
					At       time.Time `json:"at"`
					Message  string    `json:"message"`
					Error    string    `json:"error"`
					Operator string    `json:"operator"`
					Key      string    `json:"key"`
					Record   string    `json:"record"`
				} `json:"items"`
			}
			if err := c.call(cmd.Context(), "GET", "/api/v1/pipelines/"+url.PathEscape(args[0])+"/errors", nil, "", nil, &out); err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), out)
			}
			if len(out.Items) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "no errors")
			}
			for _, e := range out.Items {
				where := ""
				if e.Operator != "" {
					where = fmt.Sprintf(" operator %s key %q at %s:", e.Operator, e.Key, e.Record)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s %s:%s %s\n", e.At.Format(time.RFC3339), e.Message, where, e.Error)
			}
			return nil
		},
	}
	rescale := &cobra.Command{
		Use: "rescale ID OPERATOR=N...", Short: "change operators' parallelism (a running pipeline restarts from a savepoint)", Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			par := map[string]int{}
			for _, a := range args[1:] {
				name, n, ok := strings.Cut(a, "=")
				v, err := strconv.Atoi(n)
				if !ok || err != nil || name == "" {
					return &exitError{exitUsage, fmt.Errorf("rescale: want OPERATOR=N, not %q", a)}
				}
				par[name] = v
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			body, _ := json.Marshal(map[string]any{"parallelism": par})
			var out map[string]any
			if err := c.call(cmd.Context(), "POST", "/api/v1/pipelines/"+url.PathEscape(args[0])+"/rescale", nil, "application/json", body, &out); err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), out)
		},
	}
	cmd.AddCommand(output, logs, rescale)
	return cmd
}
