package lookup

import (
	"strings"
	"testing"
)

func TestResolvePath(t *testing.T) {
	tests := []struct {
		root, prefix, in string
		want, query      string
	}{
		{"", "/", "/v1/geo?ip=1.2.3.4", "/v1/geo", "ip=1.2.3.4"},
		{"/api", "/", "/v1/geo", "/api/v1/geo", ""},
		{"/api", "/v1", "/v1", "/api/v1", ""},
		{"/api", "/v1", "/v1/", "/api/v1/", ""},
		{"/api", "/v1/", "/v1/x", "/api/v1/x", ""},
		{"", "/v1", "/v1/a/../b", "/v1/b", ""},
		{"", "/v1", "/v1/a/%2e%2E/b", "/v1/b", ""},
		{"", "/v1", "/v1/./a/.", "/v1/a/", ""},
		{"", "/v1", "/v1//a///b", "/v1/a/b", ""},
		{"", "/", "/a/..", "/", ""},
		{"", "/", "/file.json", "/file.json", ""},
		{"", "/", "/a..b/...", "/a..b/...", ""},
		{"", "/", "/x%20y", "/x%20y", ""},
		{"", "/", "/x?a=b/c?d", "/x", "a=b/c?d"},
	}
	for _, tt := range tests {
		got, q, err := resolvePath(tt.root, tt.prefix, tt.in)
		if err != nil || got != tt.want || q != tt.query {
			t.Errorf("resolvePath(%q, %q, %q) = %q, %q, %v; want %q, %q", tt.root, tt.prefix, tt.in, got, q, err, tt.want, tt.query)
		}
	}
}

func TestResolvePathRefuses(t *testing.T) {
	for _, tt := range []struct{ prefix, in string }{
		{"/", "/.."},
		{"/", "/../etc/passwd"},
		{"/", "/a/../../b"},
		{"/", "/%2e%2e/x"},
		{"/", "/%2E./x"},
		{"/", "/.%2e/x"},
		{"/v1", "/v1/../admin"},
		{"/v1", "/v1/%2e%2e/admin"},
		{"/v1", "/v1evil"},
		{"/v1", "/v2/x"},
		{"/v1", "/"},
		{"/", "/a%2fb"},
		{"/", "/a%2Fb"},
		{"/", "/a%5cb"},
		{"/", "/a\\..\\b"},
		{"/", "/%252e%252e/x"},
		{"/", "/%252fx"},
		{"/", "/a%2"},
		{"/", "/a%zz"},
		{"/", "/a b"},
		{"/", "/a\x00"},
		{"/", "/é"},
		{"/", "/x?a b"},
		{"/", "/x?a#b"},
		{"/", "/x?%zz"},
		{"/", "x"},
		{"/", ""},
	} {
		if got, _, err := resolvePath("/api", tt.prefix, tt.in); Kind(err) != KindRefused {
			t.Errorf("resolvePath(%q, %q) = %q, %v; want refused", tt.prefix, tt.in, got, err)
		}
	}
}

func TestIsCleanPath(t *testing.T) {
	for p, want := range map[string]bool{"/": true, "/v1": true, "/v1/": true, "/a/b": true,
		"": false, "v1": false, "/v1/..": false, "//v1": false, "/a%2fb": false, "/./a": false} {
		if got := isCleanPath(p); got != want {
			t.Errorf("isCleanPath(%q) = %v", p, got)
		}
	}
}

func FuzzResolvePath(f *testing.F) {
	for _, s := range []string{"/v1/geo?ip=1", "/v1/../x", "/v1/%2e%2e/", "/v1//a/./b/", "/v1/a%2fb", "/v1\\x", "/%252e"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		const root, prefix = "/api", "/v1"
		got, q, err := resolvePath(root, prefix, p)
		if err != nil {
			if Kind(err) != KindRefused {
				t.Fatalf("kind %v", Kind(err))
			}
			return
		}
		if !strings.HasPrefix(got, root+prefix) || (len(got) > len(root+prefix) && got[len(root+prefix)] != '/') {
			t.Fatalf("%q resolved outside the prefix: %q", p, got)
		}
		guest := got[len(root):]
		low := strings.ToLower(guest)
		for _, bad := range []string{"//", "\\", "%2f", "%5c", "%252e", "%252f", "%255c"} {
			if strings.Contains(low, bad) {
				t.Fatalf("%q resolved to %q containing %q", p, got, bad)
			}
		}
		for _, seg := range strings.Split(guest, "/") {
			if dotSegment(seg) != 0 {
				t.Fatalf("%q resolved to %q with dot segment %q", p, got, seg)
			}
		}
		// Idempotent: the result resolves to itself.
		again, q2, err := resolvePath(root, prefix, guest+func() string {
			if strings.Contains(p, "?") {
				return "?" + q
			}
			return ""
		}())
		if err != nil || again != got || q2 != q {
			t.Fatalf("not idempotent: %q -> %q -> %q, %v", p, got, again, err)
		}
	})
}
