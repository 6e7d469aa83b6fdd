package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/clink-wasm/clink-wasm/host/server"
)

// parseQuotaSets turns --set key=value flags into a quota patch. Values are integers, except
// allowed_lookup_hosts, a comma-separated list ("" for none).
func parseQuotaSets(sets []string) (map[string]any, error) {
	out := map[string]any{}
	for _, s := range sets {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return nil, &exitError{exitUsage, fmt.Errorf("--set %q: use KEY=VALUE, e.g. max_pipelines=5", s)}
		}
		if k == "allowed_lookup_hosts" {
			hosts := []string{}
			for _, h := range strings.Split(v, ",") {
				if h = strings.TrimSpace(h); h != "" {
					hosts = append(hosts, h)
				}
			}
			out[k] = hosts
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, &exitError{exitUsage, fmt.Errorf("--set %s: %q is not an integer", k, v)}
		}
		out[k] = n
	}
	return out, nil
}

func newTenantCmd() *cobra.Command {
	var f clientFlags
	cmd := &cobra.Command{Use: "tenant", Short: "create tenants and show or change their quotas (admin)"}
	addClientFlags(cmd, &f)

	var createSets []string
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "create a tenant and print its token (shown once)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			q, err := parseQuotaSets(createSets)
			if err != nil {
				return err
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			body, _ := json.Marshal(map[string]any{"name": args[0], "quotas": q})
			var out struct {
				server.TenantView
				Token string `json:"token"`
			}
			if err := c.call(cmd.Context(), "POST", "/api/v1/tenants", nil, "application/json", body, &out); err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), out)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "created tenant %s\ntoken: %s\n(the token is shown once: store it now)\n", out.Name, out.Token)
			return nil
		},
	}
	create.Flags().StringArrayVar(&createSets, "set", nil, "a quota KEY=VALUE (repeatable), e.g. --set max_pipelines=5 --set allowed_lookup_hosts=geo.internal,api.internal:8443")

	ls := &cobra.Command{
		Use:   "ls",
		Short: "list tenants with their usage",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			all, err := listAll[server.TenantView](cmd.Context(), c, "/api/v1/tenants", nil)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), all)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tPIPELINES\tSUBTASKS\tMODULES\tMODULE BYTES\tAPI REQ/S\tCREATED")
			for _, t := range all {
				fmt.Fprintf(tw, "%s\t%d/%d\t%d/%d\t%d/%d\t%d\t%d\t%s\n", t.Name, t.Usage.Pipelines, t.Quotas.MaxPipelines,
					t.Usage.Subtasks, t.Quotas.MaxSubtasks, t.Usage.Modules, t.Quotas.MaxModules, t.Usage.ModuleBytes,
					t.Quotas.APIRequestsPerSec, t.CreatedAt.Format("2006-01-02 15:04"))
			}
			return tw.Flush()
		},
	}

	var sets []string
	quota := &cobra.Command{
		Use:   "quota NAME [--set KEY=VALUE ...]",
		Short: "show a tenant's quotas and usage; --set changes quotas (admin; applies at once)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			var t server.TenantView
			path := "/api/v1/tenants/" + url.PathEscape(args[0])
			if len(sets) > 0 {
				q, err := parseQuotaSets(sets)
				if err != nil {
					return err
				}
				body, _ := json.Marshal(map[string]any{"quotas": q})
				err = c.call(cmd.Context(), "PATCH", path, nil, "application/json", body, &t)
				if err != nil {
					return err
				}
			} else if err := c.call(cmd.Context(), "GET", path, nil, "", nil, &t); err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), t)
			}
			printQuotas(cmd.OutOrStdout(), t)
			return nil
		},
	}
	quota.Flags().StringArrayVar(&sets, "set", nil, "a quota KEY=VALUE to change (repeatable)")
	cmd.AddCommand(create, ls, quota)
	return cmd
}

func printQuotas(w io.Writer, t server.TenantView) {
	q, u := t.Quotas, t.Usage
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "tenant %s\n\nQUOTA\tLIMIT\tUSED\n", t.Name)
	rows := []struct {
		k, v, used string
	}{
		{"max_pipelines", fmt.Sprint(q.MaxPipelines), fmt.Sprint(u.Pipelines)},
		{"max_subtasks", fmt.Sprint(q.MaxSubtasks), fmt.Sprint(u.Subtasks)},
		{"max_modules", fmt.Sprint(q.MaxModules), fmt.Sprint(u.Modules)},
		{"max_module_bytes", fmt.Sprint(q.MaxModuleBytes), "-"},
		{"guest_memory_bytes", fmt.Sprint(q.GuestMemoryBytes), "-"},
		{"cpu_time_per_record_ms", fmt.Sprint(q.CPUTimePerRecordMs), "-"},
		{"max_in_flight_records", fmt.Sprint(q.MaxInFlightRecords), "-"},
		{"hot_tier_bytes", fmt.Sprint(q.HotTierBytes), "-"},
		{"state_bytes", fmt.Sprint(q.StateBytes), "-"},
		{"lookup_requests_per_second", fmt.Sprint(q.LookupRequestsPerSec), "-"},
		{"allowed_lookup_hosts", orDash(q.AllowedLookupHosts), "-"},
		{"api_requests_per_second", fmt.Sprint(q.APIRequestsPerSec), "-"},
	}
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.k, r.v, r.used)
	}
	tw.Flush()
}
