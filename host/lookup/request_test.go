package lookup

import (
	"bytes"
	"reflect"
	"testing"
)

func TestParseRequest(t *testing.T) {
	tests := []struct {
		in   string
		want Request
	}{
		{"GET /v1/geo?ip=1.2.3.4", Request{Method: "GET", Path: "/v1/geo?ip=1.2.3.4"}},
		{"GET /\n", Request{Method: "GET", Path: "/"}},
		{"GET /\n\n", Request{Method: "GET", Path: "/"}},
		{"POST /x\nContent-Type: application/json\n\n{\"a\":1}", Request{Method: "POST", Path: "/x",
			Header: []HeaderField{{"Content-Type", "application/json"}}, Body: []byte(`{"a":1}`)}},
		{"PUT /x\nA: 1\nA: 2\nB: \n", Request{Method: "PUT", Path: "/x",
			Header: []HeaderField{{"A", "1"}, {"A", "2"}, {"B", ""}}}},
		{"DELETE /x\nA: v", Request{Method: "DELETE", Path: "/x", Header: []HeaderField{{"A", "v"}}}},
		{"PATCH /x\n\n\n\nbody\n", Request{Method: "PATCH", Path: "/x", Body: []byte("\n\nbody\n")}},
		{"HEAD /x\nX-Tab: a\tb: c\n\n", Request{Method: "HEAD", Path: "/x", Header: []HeaderField{{"X-Tab", "a\tb: c"}}}},
	}
	for _, tt := range tests {
		got, err := ParseRequest([]byte(tt.in))
		if err != nil {
			t.Errorf("ParseRequest(%q): %v", tt.in, err)
			continue
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseRequest(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
	}
}

func TestParseRequestRejects(t *testing.T) {
	for _, in := range []string{
		"",
		"GET",
		"GET ",
		"get /x",
		"CONNECT /x",
		"GET  /x",
		"GET x",
		"GET /x HTTP/1.1",
		"GET /a b",
		"GET /x#frag",
		"GET /x\r\n",
		"GET /\xff",
		"GET /x\nNoColon\n\n",
		"GET /x\nName:value\n\n",
		"GET /x\n: v\n\n",
		"GET /x\nBad Name: v\n\n",
		"GET /x\nA: v\r\n\n",
		"GET /x\nA: v\x00\n\n",
		"GET /x\nA: v\n\r\n",
		"GET /x\n body\n",
	} {
		if _, err := ParseRequest([]byte(in)); Kind(err) != KindRefused {
			t.Errorf("ParseRequest(%q) err = %v, want refused", in, err)
		}
	}
	many := []byte("GET /x\n")
	for range maxHeaders + 1 {
		many = append(many, "A: b\n"...)
	}
	if _, err := ParseRequest(many); Kind(err) != KindRefused {
		t.Errorf("too many headers: err = %v", err)
	}
}

func TestParseRequestDoesNotAlias(t *testing.T) {
	b := []byte("POST /x\nA: b\n\nbody")
	r, err := ParseRequest(b)
	if err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = 'z'
	}
	if r.Path != "/x" || r.Header[0] != (HeaderField{"A", "b"}) || string(r.Body) != "body" {
		t.Fatalf("request aliases input: %+v", r)
	}
}

func TestParseRequestAllocs(t *testing.T) {
	b := []byte("POST /v1/geo?ip=1.2.3.4\nAccept: application/json\nX-Trace: abc\n\n{}")
	n := testing.AllocsPerRun(100, func() {
		if _, err := ParseRequest(b); err != nil {
			t.Fatal(err)
		}
	})
	if n > 4 {
		t.Errorf("ParseRequest allocates %v times, want <= 4", n)
	}
}

func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		"GET /v1/geo?ip=1.2.3.4",
		"POST /x\nContent-Type: application/json\n\n{}",
		"GET /x\nA: 1\nA: 2\n",
		"GET /x\n\n",
		"GET /../x\n\n",
		"DELETE /%2e%2e\nA: \n\nb",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRequest(b)
		// DoRaw's in-place parse (over its own copy) yields what the copying one does.
		ra, aerr := parseRequest(bytes.Clone(b), true)
		if (err == nil) != (aerr == nil) || err != nil && err.Error() != aerr.Error() {
			t.Fatalf("in place: error %v, copying: %v", aerr, err)
		}
		if !reflect.DeepEqual(ra, r) {
			t.Fatalf("in place: %+v, copying: %+v", ra, r)
		}
		if err != nil {
			if Kind(err) != KindRefused {
				t.Fatalf("error of kind %v: %v", Kind(err), err)
			}
			return
		}
		if !safe(r.Method) && !idempotent(r.Method) && r.Method != "POST" && r.Method != "PATCH" {
			t.Fatalf("method %q", r.Method)
		}
		if r.Path == "" || r.Path[0] != '/' {
			t.Fatalf("path %q", r.Path)
		}
		for _, h := range r.Header {
			if bytes.ContainsAny([]byte(h.Name+h.Value), "\r\n\x00") {
				t.Fatalf("header %q", h)
			}
		}
		// Round trip: formatting and reparsing yields the same request.
		r2, err := ParseRequest(r.AppendTo(nil))
		if err != nil {
			t.Fatalf("reparse of %q: %v", r.AppendTo(nil), err)
		}
		if r2.Method != r.Method || r2.Path != r.Path || !bytes.Equal(r2.Body, r.Body) || len(r2.Header) != len(r.Header) {
			t.Fatalf("round trip: %+v != %+v", r2, r)
		}
		for i := range r.Header {
			if r.Header[i] != r2.Header[i] {
				t.Fatalf("round trip header %d: %q != %q", i, r2.Header[i], r.Header[i])
			}
		}
	})
}
