package lookup

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
)

// Every test here runs with the loopbackOnly dialer, which fails the test if it is asked to
// connect anywhere but 127.0.0.1; the assertions check additionally that the refused target
// was never even offered to it.

func TestSSRFRedirectToMetadata(t *testing.T) {
	t.Parallel()
	for _, target := range []string{
		"http://169.254.169.254/latest/meta-data/iam/security-credentials/",
		"http://[fd00:ec2::254]/latest/meta-data/",
		"http://metadata.google.internal/computeMetadata/v1/",
		"http://100.100.100.200/latest/meta-data/",
		"http://example.com/",          // a foreign host
		"https://127.0.0.1/x",          // same host, other scheme: another origin
		"http://127.0.0.1:1/x",         // same host, other port: another origin
		"//169.254.169.254/x",          // scheme-relative
		"/\\169.254.169.254/x",         // backslash tricks
		"http://0x7f000001/loopback-2", // numeric host forms are another origin too
	} {
		t.Run(target, func(t *testing.T) {
			t.Parallel()
			dial, dialled := loopbackOnly(t)
			s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, target, http.StatusFound)
			})
			cfg := testConfig(s.URL)
			cfg.MaxRedirects = 5 // even when redirects are followed, never off-origin
			e := open(t, NewRegistry(WithDialer(dial)), "t1", cfg)
			r := do(t, e, context.Background(), "GET /start")
			wantKind(t, r, KindRefused)
			for _, a := range dialled() {
				if a != strings.TrimPrefix(s.URL, "http://") {
					t.Fatalf("dialled %s", a)
				}
			}
			if s.total() != 1 {
				t.Fatalf("%d requests reached the server, want 1", s.total())
			}
			if m := e.Metrics(); m.Attempts != 1 {
				t.Fatalf("refused redirect was retried: %d attempts", m.Attempts)
			}
		})
	}
}

func TestSameOriginRedirect(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/old":
			http.Redirect(w, r, "/v1/new", http.StatusMovedPermanently)
		case "/v1/escape":
			http.Redirect(w, r, "/admin", http.StatusFound)
		case "/v1/loop":
			http.Redirect(w, r, "/v1/loop", http.StatusFound)
		default:
			io.WriteString(w, r.URL.Path)
		}
	})
	cfg := testConfig(s.URL)
	cfg.PathPrefix = "/v1"
	cfg.MaxRedirects = 2
	e := open(t, testRegistry(t), "t1", cfg)
	wantStatus(t, do(t, e, context.Background(), "GET /v1/old"), 200, "/v1/new")
	wantKind(t, do(t, e, context.Background(), "GET /v1/escape"), KindRefused)
	wantStatus(t, do(t, e, context.Background(), "GET /v1/loop"), 302, "") // bounded: the 3xx is the answer
	if s.hits("/admin") != 0 {
		t.Fatal("redirect outside the prefix was followed")
	}
	// Without redirects, the 3xx is the response.
	cfg.Name, cfg.MaxRedirects = "noredirect", 0
	e2 := open(t, testRegistry(t), "t1", cfg)
	wantStatus(t, do(t, e2, context.Background(), "GET /v1/old"), 301, "")
}

func TestSSRFPathEscape(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) { hits.Add(1) })
	cfg := testConfig(s.URL + "/tenant-a")
	cfg.PathPrefix = "/geo"
	e := open(t, testRegistry(t), "t1", cfg)
	for _, p := range []string{
		"/geo/../../tenant-b/secrets", "/geo/%2e%2e/%2e%2e/tenant-b", "/geo/..%2f..%2ftenant-b",
		"/geo/%2E%2E%5c%2E%2E%5ctenant-b", "/geo\\..\\..\\tenant-b", "/geo/%252e%252e/x", "/geo/../admin",
		"/geography", "/..",
	} {
		wantKind(t, do(t, e, context.Background(), "GET "+p), KindRefused)
	}
	if hits.Load() != 0 {
		t.Fatalf("%d escaping requests reached the server", hits.Load())
	}
}

func TestSSRFForbiddenAddresses(t *testing.T) {
	t.Parallel()
	// Base URLs that point at forbidden places are refused when the endpoint is opened.
	for _, base := range []string{
		"http://169.254.169.254/", "http://[fd00:ec2::254]/", "http://100.100.100.200",
		"http://metadata.google.internal/", "http://METADATA.GOOGLE.INTERNAL./", "http://169.254.1.1/",
		"http://[fe80::1]/", "http://[::ffff:169.254.169.254]/", "http://0.0.0.0/", "http://224.0.0.1/",
		"ftp://127.0.0.1/", "http://user:pw@127.0.0.1/", "http://127.0.0.1/?q=1", "http://127.0.0.1/a/../b",
	} {
		cfg := testConfig(base)
		if _, err := testRegistry(t).Open("t1", cfg); err == nil {
			t.Errorf("base URL %s accepted", base)
		}
	}
	// Loopback needs an explicit allowance.
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {})
	cfg := testConfig(s.URL)
	cfg.Egress.AllowLoopback = false
	if _, err := testRegistry(t).Open("t1", cfg); err == nil {
		t.Error("loopback base URL accepted without egress.allow_loopback")
	}
}

// A name that resolves to a metadata address (DNS rebinding, or a hostile record) is refused
// at dial time, on the resolved address, before the dialer is asked.
func TestSSRFRebinding(t *testing.T) {
	t.Parallel()
	var answers atomic.Int32
	resolve := func(_ context.Context, host string) ([]netip.Addr, error) {
		answers.Add(1)
		switch host {
		case "rebind.test":
			return []netip.Addr{netip.MustParseAddr("169.254.169.254")}, nil
		case "mapped.test":
			return []netip.Addr{netip.MustParseAddr("::ffff:169.254.169.254")}, nil
		case "nat64.test":
			return []netip.Addr{netip.MustParseAddr("64:ff9b::a9fe:a9fe")}, nil
		case "linklocal.test":
			return []netip.Addr{netip.MustParseAddr("fe80::1%eth0")}, nil
		case "mixed.test": // a forbidden answer next to an allowed one: only the allowed is dialled
			return []netip.Addr{netip.MustParseAddr("169.254.169.254"), netip.MustParseAddr("127.0.0.1")}, nil
		}
		return nil, errors.New("no such host")
	}
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "reached") })
	port := s.URL[strings.LastIndexByte(s.URL, ':'):]
	for _, host := range []string{"rebind.test", "mapped.test", "nat64.test", "linklocal.test"} {
		dial, dialled := loopbackOnly(t)
		reg := NewRegistry(WithDialer(dial), WithResolver(resolve))
		cfg := testConfig("http://" + host + port)
		cfg.Retry.MaxAttempts = 1
		e := open(t, reg, "t1", cfg)
		r := do(t, e, context.Background(), "GET /latest/meta-data/")
		wantKind(t, r, KindRefused)
		if !strings.Contains(r.Err.Error(), "forbidden address") {
			t.Errorf("%s: %v", host, r.Err)
		}
		if d := dialled(); len(d) != 0 {
			t.Fatalf("%s: dialled %v", host, d)
		}
	}
	dial, dialled := loopbackOnly(t)
	e := open(t, NewRegistry(WithDialer(dial), WithResolver(resolve)), "t1", testConfig("http://mixed.test"+port))
	wantStatus(t, do(t, e, context.Background(), "GET /"), 200, "reached")
	if d := dialled(); len(d) != 1 || !strings.HasPrefix(d[0], "127.0.0.1:") {
		t.Fatalf("dialled %v", d)
	}
}

func TestEgressPolicyCheck(t *testing.T) {
	pol, err := EgressPolicy{DeniedCIDRs: []string{"10.1.0.0/16"}}.compile()
	if err != nil {
		t.Fatal(err)
	}
	for addr, ok := range map[string]bool{
		"10.0.0.1": true, "192.168.1.1": true, "8.8.8.8": true, "2001:db8::1": true,
		"127.0.0.1": false, "::1": false, "0.0.0.0": false, "::": false, "169.254.169.254": false,
		"169.254.10.10": false, "fe80::1": false, "fd00:ec2::254": false, "100.100.100.200": false,
		"::ffff:127.0.0.1": false, "::ffff:169.254.169.254": false, "64:ff9b::7f00:1": false,
		"2002:a9fe:a9fe::1": false, "224.0.0.1": false, "255.255.255.255": false, "10.1.2.3": false,
	} {
		err := pol.check(netip.MustParseAddr(addr))
		if (err == nil) != ok {
			t.Errorf("check(%s) = %v, want allowed=%v", addr, err, ok)
		}
	}
	allow, _ := EgressPolicy{AllowLinkLocal: true, AllowedCIDRs: []string{"169.254.0.0/16"}}.compile()
	if allow.check(netip.MustParseAddr("169.254.10.10")) != nil || allow.check(netip.MustParseAddr("169.254.169.254")) == nil ||
		allow.check(netip.MustParseAddr("10.0.0.1")) == nil {
		t.Error("allow-list / link-local allowance")
	}
	meta, _ := EgressPolicy{AllowMetadata: true}.compile()
	if meta.check(netip.MustParseAddr("169.254.169.254")) != nil {
		t.Error("allow_metadata does not admit the metadata address")
	}
}

func TestConfigJSON(t *testing.T) {
	const spec = `{
		"name": "geo", "base_url": "https://geo.example.com/api", "methods": ["GET"],
		"path_prefix": "/v1", "headers": {"Authorization": "Bearer ${env:GEO_TOKEN}"},
		"timeout": "250ms", "max_in_flight": 64,
		"retry": {"max_attempts": 4, "initial_backoff": "20ms", "statuses": ["5xx", "429"]},
		"breaker": {"consecutive_failures": 3, "cooldown": "5s"},
		"cache": {"ttl": "1m", "statuses": ["200", "404"]},
		"concurrency": {"algorithm": "aimd"}
	}`
	var cfg EndpointConfig
	if err := jsonUnmarshal([]byte(spec), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.Timeout != Duration(250e6) || cfg.Retry.MaxAttempts != 4 || cfg.Cache.MaxEntries != defaultCacheEntries ||
		cfg.MaxQueued != 256 || cfg.Concurrency.MinLimit != 4 || cfg.Concurrency.InitialLimit != 16 {
		t.Fatalf("%+v", cfg)
	}
	b, err := jsonMarshal(cfg)
	if err != nil || !strings.Contains(string(b), `"timeout":"250ms"`) || !strings.Contains(string(b), "${env:GEO_TOKEN}") {
		t.Fatalf("marshal: %s %v", b, err)
	}
	for _, bad := range []string{
		`{"name": "x", "base_url": "http://h", "methods": ["TRACE"]}`,
		`{"name": "x", "base_url": "http://h", "path_prefix": "/a/../b"}`,
		`{"name": "x", "base_url": "http://h", "headers": {"Host": "y"}}`,
		`{"name": "x", "base_url": "http://h", "retry": {"statuses": ["7xx"]}}`,
		`{"name": "x", "base_url": "http://h", "retry": {"max_attempts": 50}}`,
		`{"name": "x", "base_url": "http://h", "cache": {}}`,
		`{"name": "x", "base_url": "http://h", "concurrency": {"algorithm": "magic"}}`,
		`{"name": "x", "base_url": "http://h", "egress": {"allowed_cidrs": ["nope"]}}`,
		`{"name": "", "base_url": "http://h"}`,
		`{"name": "x", "base_url": "http://h", "timeout": 5}`,
		`{"name": "x", "base_url": "http://h", "transport": "loop"}`, // removed
		`{"name": "x", "base_url": "http://h", "transport": "h3"}`,
	} {
		var c EndpointConfig
		if err := jsonUnmarshal([]byte(bad), &c); err != nil {
			continue
		}
		c.EnsureDefaults()
		if err := c.Validate(); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

// Redirects keep net/http's method and body rules (the endpoint follows them itself):
// 301/302/303 turn a POST into a GET without body, 307/308 resend the method and body.
func TestRedirectMethods(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/303", "/v1/302":
			http.Redirect(w, r, "/v1/echo", map[string]int{"/v1/303": 303, "/v1/302": 302}[r.URL.Path])
		case "/v1/307", "/v1/308":
			http.Redirect(w, r, "echo?q=1", map[string]int{"/v1/307": 307, "/v1/308": 308}[r.URL.Path])
		default:
			b, _ := io.ReadAll(r.Body)
			io.WriteString(w, r.Method+" "+r.URL.RequestURI()+" "+string(b))
		}
	})
	cfg := testConfig(s.URL)
	cfg.PathPrefix = "/v1"
	cfg.MaxRedirects = 1
	cfg.SingleFlight = "off"
	e := open(t, testRegistry(t), "t1", cfg)
	for raw, want := range map[string]string{
		"POST /v1/303\n\nbody":   "GET /v1/echo ",
		"POST /v1/302\n\nbody":   "GET /v1/echo ",
		"HEAD /v1/303":           "",
		"POST /v1/307\n\nbody":   "POST /v1/echo?q=1 body",
		"PUT /v1/308\n\nbody":    "PUT /v1/echo?q=1 body",
		"DELETE /v1/307\n\nbody": "DELETE /v1/echo?q=1 body",
	} {
		wantStatus(t, do(t, e, context.Background(), raw), 200, want)
	}
}
