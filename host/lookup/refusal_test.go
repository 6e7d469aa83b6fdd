package lookup

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// recordHandler keeps every log record, for assertions.
type recordHandler struct {
	mu    sync.Mutex
	attrs []slog.Attr
	recs  *[]map[string]string
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &recordHandler{attrs: append(append([]slog.Attr(nil), h.attrs...), as...), recs: h.recs}
}
func (h *recordHandler) WithGroup(string) slog.Handler { return h }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	m := map[string]string{"msg": r.Message, "level": r.Level.String()}
	for _, a := range h.attrs {
		m[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	h.mu.Lock()
	*h.recs = append(*h.recs, m)
	h.mu.Unlock()
	return nil
}

// TestRefusalReasons: every refusal names its rule in the error text, is counted by rule, and
// is logged with the rule (first one at once, then at most one line a second per rule).
func TestRefusalReasons(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mn := newMemNet(t, func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/away" {
				http.Redirect(w, r, "http://127.0.0.2/elsewhere", http.StatusFound)
			}
		})
		var recs []map[string]string
		h := &recordHandler{recs: &recs}
		cfg := memConfig()
		cfg.Methods = []string{"GET"}
		cfg.PathPrefix = "/v1"
		cfg.MaxRedirects = 3
		cfg.Headers = map[string]string{"Authorization": "Bearer s3cret"}
		e := open(t, NewRegistry(WithDialer(mn.dial), WithLogger(slog.New(h))), "tenant-a", cfg)
		cases := []struct{ raw, rule, text string }{
			{"DELETE /v1/x", RuleMethods, "refused by rule methods: method DELETE not allowed"},
			{"GET /v2/x", RulePathPrefix, "refused by rule path_prefix"},
			{"GET /v1/a%2Fb", RulePath, "refused by rule path: encoded slash"},
			{"GET /v1/x\nAuthorization: mine\n", RuleHeaders, "refused by rule headers: header Authorization may not be set"},
			{"GET /v1/away", RuleRedirect, "refused by rule redirect: redirect to another origin"},
			{"GET v1", RuleRequestFormat, "refused by rule request_format"},
		}
		for _, c := range cases {
			ch := make(chan Response, 1)
			e.DoRaw(context.Background(), []byte(c.raw), func(r Response) { ch <- r })
			r := <-ch
			if Kind(r.Err) != KindRefused || !strings.Contains(r.Err.Error(), c.text) {
				t.Errorf("%q: %v, want KindRefused with %q", c.raw, r.Err, c.text)
			}
			if !strings.HasPrefix(r.Err.Error(), "lookup svc: refused by rule "+c.rule) {
				t.Errorf("%q: %q does not start with the endpoint and rule", c.raw, r.Err)
			}
		}
		// The same rule again at once: counted, not logged; a second later: logged again.
		wantKind(t, do(t, e, context.Background(), "DELETE /v1/y"), KindRefused)
		m := e.Metrics()
		for _, c := range cases {
			want := uint64(1)
			if c.rule == RuleMethods {
				want = 2
			}
			if got := m.RefusedBy(c.rule); got != want {
				t.Errorf("RefusedBy(%s) = %d, want %d", c.rule, got, want)
			}
		}
		if m.ErrorsOf(KindRefused) != uint64(len(cases)+1) || m.RefusedBy("nonsense") != 0 {
			t.Errorf("refused %d, want %d", m.ErrorsOf(KindRefused), len(cases)+1)
		}
		time.Sleep(time.Second)
		wantKind(t, do(t, e, context.Background(), "DELETE /v1/z"), KindRefused)

		var refusals []map[string]string
		for _, r := range recs {
			if r["msg"] == "lookup refused" {
				refusals = append(refusals, r)
			}
			for _, v := range r {
				if strings.Contains(v, "s3cret") {
					t.Errorf("a log line carries the injected secret: %v", r)
				}
			}
		}
		if len(refusals) != len(cases)+1 {
			t.Fatalf("%d refusal lines, want %d (one per rule, then one after a second): %v", len(refusals), len(cases)+1, refusals)
		}
		for i, c := range cases {
			if r := refusals[i]; r["rule"] != c.rule || r["endpoint"] != "svc" || r["tenant"] != "tenant-a" || r["level"] != "WARN" {
				t.Errorf("line %d: %v, want rule %s for tenant-a/svc at WARN", i, r, c.rule)
			}
		}
		if last := refusals[len(refusals)-1]; last["rule"] != RuleMethods || last["refused_by_rule"] != "3" {
			t.Errorf("last line %v, want rule methods with the running count 3", last)
		}

		// --stats prints the snapshot as labelled JSON.
		b, err := json.Marshal(e.Metrics())
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			Requests uint64            `json:"requests"`
			Errors   map[string]uint64 `json:"errors_by_kind"`
			Refused  map[string]uint64 `json:"refused_by_rule"`
			Classes  map[string]uint64 `json:"responses_by_class"`
			Breaker  string            `json:"breaker_state"`
		}
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if got.Requests != uint64(len(cases)+2) || got.Errors["refused"] != uint64(len(cases)+2) ||
			got.Refused[RuleMethods] != 3 || got.Refused[RuleEgress] != 0 || len(got.Refused) != numRules ||
			got.Classes["2xx"] != 0 || got.Breaker != "closed" {
			t.Errorf("stats JSON %s", b)
		}
	})
}

// TestEgressRefusalRule: a dial the egress policy forbids is refused by rule egress.
func TestEgressRefusalRule(t *testing.T) {
	cfg := testConfig("http://upstream.test:9")
	cfg.Egress.AllowLoopback = false
	resolve := func(context.Context, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	e := open(t, testRegistry(t, WithResolver(resolve)), "t1", cfg)
	r := do(t, e, context.Background(), "GET /x")
	if Kind(r.Err) != KindRefused || !strings.Contains(r.Err.Error(), "refused by rule egress: forbidden address 127.0.0.1") {
		t.Fatalf("%v, want a refusal by rule egress", r.Err)
	}
	if m := e.Metrics(); m.RefusedBy(RuleEgress) != 1 {
		t.Fatalf("RefusedBy(egress) = %d", m.RefusedBy(RuleEgress))
	}
}
