package main

import (
	"fmt"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/clink-wasm/clink-wasm/host/server"
)

func newModuleCmd() *cobra.Command {
	var f clientFlags
	cmd := &cobra.Command{Use: "module", Short: "push, list, show and remove modules on a server"}
	addClientFlags(cmd, &f)

	var name, version string
	push := &cobra.Command{
		Use:   "push OP.wasm",
		Short: "upload a module; it is validated against the ABI and the tenant's quotas",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			bin, err := os.ReadFile(args[0])
			if err != nil {
				return &exitError{exitFailure, fmt.Errorf("reading the module: %w", err)}
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			q := url.Values{}
			if name != "" {
				q.Set("name", name)
			}
			if version != "" {
				q.Set("version", version)
			}
			var m server.ModuleView
			if err := c.call(cmd.Context(), "POST", "/api/v1/modules", q, "application/wasm", bin, &m); err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), m)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "pushed %s  %s  (%d bytes)\n", m.Ref, m.ID, m.Size)
			return nil
		},
	}
	push.Flags().StringVar(&name, "name", "", "module name (default: the manifest's name)")
	push.Flags().StringVar(&version, "version", "", "version (default: the next integer for the name)")

	var only string
	ls := &cobra.Command{
		Use:   "ls",
		Short: "list modules",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			q := url.Values{}
			if only != "" {
				q.Set("name", only)
			}
			all, err := listAll[server.ModuleView](cmd.Context(), c, "/api/v1/modules", q)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), all)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tVERSION\tID\tSIZE\tSTATES\tENDPOINTS\tUSED BY\tTENANT")
			for _, m := range all {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", m.Name, m.Version, m.ID[:12], m.Size,
					orDash(m.Manifest.States), orDash(m.Manifest.Endpoints), orDash(m.UsedBy), m.Tenant)
			}
			return tw.Flush()
		},
	}
	ls.Flags().StringVar(&only, "name", "", "only this name's versions")

	get := &cobra.Command{
		Use:   "get ID|NAME@VERSION|NAME",
		Short: "show a module",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			var m server.ModuleView
			if err := c.call(cmd.Context(), "GET", "/api/v1/modules/"+url.PathEscape(args[0]), nil, "", nil, &m); err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), m)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "module:     %s\n", m.Ref)
			fmt.Fprintf(w, "id:         %s\n", m.ID)
			fmt.Fprintf(w, "tenant:     %s\n", m.Tenant)
			fmt.Fprintf(w, "size:       %d bytes\n", m.Size)
			fmt.Fprintf(w, "operator:   %s (abi v%d)\n", m.Manifest.Name, m.Manifest.ABI)
			fmt.Fprintf(w, "states:     %s\n", orDash(m.Manifest.States))
			fmt.Fprintf(w, "endpoints:  %s\n", orDash(m.Manifest.Endpoints))
			fmt.Fprintf(w, "memory:     %s\n", m.Memory)
			fmt.Fprintf(w, "created:    %s\n", m.CreatedAt)
			fmt.Fprintf(w, "used by:    %s\n", orDash(m.UsedBy))
			return nil
		},
	}
	rm := &cobra.Command{
		Use:   "rm ID|NAME@VERSION",
		Short: "remove a module (refused while a pipeline uses it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			if err := c.call(cmd.Context(), "DELETE", "/api/v1/modules/"+url.PathEscape(args[0]), nil, "", nil, nil); err != nil {
				return err
			}
			if !f.json {
				fmt.Fprintf(cmd.OutOrStdout(), "removed %s\n", args[0])
			}
			return nil
		},
	}
	cmd.AddCommand(push, ls, get, rm)
	return cmd
}

func orDash(s []string) string {
	if len(s) == 0 {
		return "-"
	}
	return strings.Join(s, ",")
}
