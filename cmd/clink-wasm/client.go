package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// clientConfig is where the client commands find the server and the token: flags, then the
// environment (CLINK_SERVER, CLINK_TOKEN), then the config file ($CLINK_CONFIG, or
// $XDG_CONFIG_HOME/clink/config.json, or ~/.config/clink/config.json), then the default server.
type clientConfig struct {
	Server string `json:"server"`
	Token  string `json:"token"`
}

type clientFlags struct {
	server, token, config, tenant string
	json                          bool
}

func addClientFlags(cmd *cobra.Command, f *clientFlags) {
	pf := cmd.PersistentFlags()
	pf.StringVar(&f.server, "server", "", "server URL (env CLINK_SERVER; default http://"+defaultListen+")")
	pf.StringVar(&f.token, "token", "", "API token (env CLINK_TOKEN)")
	pf.StringVar(&f.config, "config", "", "config file with {\"server\": ..., \"token\": ...} (env CLINK_CONFIG)")
	pf.StringVar(&f.tenant, "tenant", "", "the tenant to act for (with the admin token)")
	pf.BoolVar(&f.json, "json", false, "print JSON instead of a table")
}

const defaultListen = "127.0.0.1:8080"

func configPath(flag string) string {
	if flag != "" {
		return flag
	}
	if p := os.Getenv("CLINK_CONFIG"); p != "" {
		return p
	}
	if x := os.Getenv("XDG_CONFIG_HOME"); x != "" {
		return filepath.Join(x, "clink", "config.json")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".config", "clink", "config.json")
	}
	return ""
}

// resolve applies the precedence: flags, environment, config file, default.
func (f *clientFlags) resolve() (clientConfig, error) {
	var file clientConfig
	if p := configPath(f.config); p != "" {
		b, err := os.ReadFile(p)
		switch {
		case err == nil:
			if err := json.Unmarshal(b, &file); err != nil {
				return file, &exitError{exitUsage, fmt.Errorf("config file %s: %w", p, err)}
			}
		case f.config != "" || !errors.Is(err, os.ErrNotExist):
			return file, &exitError{exitUsage, fmt.Errorf("config file: %w", err)}
		}
	}
	pick := func(vals ...string) string {
		for _, v := range vals {
			if v != "" {
				return v
			}
		}
		return ""
	}
	c := clientConfig{
		Server: pick(f.server, os.Getenv("CLINK_SERVER"), file.Server, "http://"+defaultListen),
		Token:  pick(f.token, os.Getenv("CLINK_TOKEN"), file.Token),
	}
	u, err := url.Parse(c.Server)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return c, &exitError{exitUsage, fmt.Errorf("server %q is not an http(s) URL", c.Server)}
	}
	c.Server = strings.TrimRight(c.Server, "/")
	if c.Token == "" {
		return c, &exitError{exitAuth, errors.New("no token: pass --token, set CLINK_TOKEN, or put \"token\" in the config file")}
	}
	return c, nil
}

type apiClient struct {
	cfg    clientConfig
	tenant string
	hc     *http.Client
}

func (f *clientFlags) client() (*apiClient, error) {
	cfg, err := f.resolve()
	if err != nil {
		return nil, err
	}
	return &apiClient{cfg: cfg, tenant: f.tenant, hc: &http.Client{Timeout: 5 * time.Minute}}, nil
}

// apiProblem is the server's problem document.
type apiProblem struct {
	Status   int    `json:"status"`
	Title    string `json:"title"`
	Detail   string `json:"detail"`
	Code     string `json:"code"`
	Field    string `json:"field"`
	Problems []struct {
		Source string `json:"source"`
		Detail string `json:"detail"`
	} `json:"problems"`
}

func exitForStatus(status int) int {
	switch status {
	case 401, 403:
		return exitAuth
	case 404:
		return exitNotFound
	case 409:
		return exitConflict
	case 400, 413, 415, 422:
		return exitInvalid
	case 429, 501, 503:
		return exitUnavailable
	}
	return exitFailure
}

// call sends a request and decodes a 2xx JSON answer into out (when not nil). A problem answer
// becomes an *exitError whose message is the problem's, with every module problem listed.
func (c *apiClient) call(ctx context.Context, method, path string, query url.Values, ctype string, body []byte, out any) error {
	return c.callStream(ctx, method, path, query, ctype, body, out, nil)
}

// callStream is call, but a successful answer's body is copied to w as it arrives (when w is
// not nil) instead of being decoded: for JSON Lines and ?follow=1 streams.
func (c *apiClient) callStream(ctx context.Context, method, path string, query url.Values, ctype string, body []byte, out any, w io.Writer) error {
	if c.tenant != "" {
		if query == nil {
			query = url.Values{}
		}
		query.Set("tenant", c.tenant)
	}
	u := c.cfg.Server + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return &exitError{exitUsage, err}
	}
	req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	req.Header.Set("Accept", "application/json")
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return &exitError{exitUnreachable, fmt.Errorf("cannot reach %s: %w (is `clink-wasm serve` running there?)", c.cfg.Server, err)}
	}
	defer resp.Body.Close()
	if w != nil && resp.StatusCode < 300 {
		if _, err := io.Copy(w, resp.Body); err != nil && ctx.Err() == nil {
			return &exitError{exitFailure, fmt.Errorf("reading the answer: %w", err)}
		}
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return &exitError{exitFailure, fmt.Errorf("reading the answer: %w", err)}
	}
	if resp.StatusCode >= 300 {
		var p apiProblem
		if json.Unmarshal(b, &p) != nil || p.Code == "" {
			return &exitError{exitForStatus(resp.StatusCode), fmt.Errorf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, strings.TrimSpace(string(b)))}
		}
		msg := p.Detail + " (" + p.Code + ")"
		if p.Field != "" {
			msg = p.Field + ": " + msg
		}
		for _, mp := range p.Problems {
			msg += fmt.Sprintf("\n  - [%s] %s", mp.Source, mp.Detail)
		}
		if resp.StatusCode == 401 {
			msg += "\n(check --token, CLINK_TOKEN or the config file)"
		}
		if ra := resp.Header.Get("Retry-After"); ra != "" {
			msg += fmt.Sprintf(" (retry after %ss)", ra)
		}
		return &exitError{exitForStatus(resp.StatusCode), errors.New(msg)}
	}
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return &exitError{exitFailure, fmt.Errorf("decoding the answer: %w", err)}
		}
	}
	return nil
}

// printJSON writes v indented.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// listAll reads every page of a list route.
func listAll[T any](ctx context.Context, c *apiClient, path string, q url.Values) ([]T, error) {
	var all []T
	after := ""
	for range 10000 { // pages of 1000: bounded
		pq := url.Values{"limit": {"1000"}}
		for k, v := range q {
			pq[k] = v
		}
		if after != "" {
			pq.Set("after", after)
		}
		var pg struct {
			Items []T    `json:"items"`
			Next  string `json:"next"`
		}
		if err := c.call(ctx, "GET", path, pq, "", nil, &pg); err != nil {
			return nil, err
		}
		all = append(all, pg.Items...)
		if pg.Next == "" {
			break
		}
		after = pg.Next
	}
	return all, nil
}
