package state

import (
	"net/url"
	"testing"
)

// TestPoolDefaults: the IO concurrency and the S3 connection bound default by scheme, an explicit
// value wins, and an explicit 0 is refused rather than defaulted.
func TestPoolDefaults(t *testing.T) {
	for _, tc := range []struct {
		url       string
		io, conns int
		wantErr   bool
	}{
		{url: "s3://b/p", io: 256, conns: 256},
		{url: "file:///tmp/x", io: 32, conns: 32},
		{url: "mem://x", io: 32, conns: 32},
		{url: "s3://b/p?io_concurrency=8", io: 8, conns: 8},
		{url: "s3://b/p?io_concurrency=8&max_conns=64", io: 8, conns: 64},
		{url: "s3://b/p?io_concurrency=0", wantErr: true},
		{url: "s3://b/p?max_conns=0", wantErr: true},
	} {
		u, err := url.Parse(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		c := defaultConfig()
		if err := c.applyQuery(u.Query()); err != nil {
			t.Fatalf("%s: %v", tc.url, err)
		}
		c.poolDefaults(u.Scheme)
		err = c.validate()
		if tc.wantErr {
			if err == nil {
				t.Errorf("%s: accepted (io %d, conns %d), want an error", tc.url, c.ioConcurrency, c.s3MaxConns)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.url, err)
		}
		if c.ioConcurrency != tc.io || c.s3MaxConns != tc.conns {
			t.Errorf("%s: io %d conns %d, want %d %d", tc.url, c.ioConcurrency, c.s3MaxConns, tc.io, tc.conns)
		}
	}
}
