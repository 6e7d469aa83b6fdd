package state

import (
	"net/url"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/internal/objstore"
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
				t.Errorf("%s: accepted (io %d, conns %d), want an error", tc.url, c.ioConcurrency, c.s3.MaxConns)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.url, err)
		}
		if c.ioConcurrency != tc.io || c.s3.MaxConns != tc.conns {
			t.Errorf("%s: io %d conns %d, want %d %d", tc.url, c.ioConcurrency, c.s3.MaxConns, tc.io, tc.conns)
		}
	}
}

// TestWithS3: a set field of S3Options overrides the URL's query option, a zero field keeps it
// (or the default), and a bad value is refused.
func TestWithS3(t *testing.T) {
	cfgFor := func(raw string, o S3Options) (config, error) {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		c := defaultConfig()
		if err := c.applyQuery(u.Query()); err != nil {
			return c, err
		}
		WithS3(o).apply(&c)
		c.poolDefaults(u.Scheme)
		return c, c.validate()
	}
	c, err := cfgFor("s3://b/p?endpoint=http://127.0.0.1:1&max_attempts=3&path_style=true",
		S3Options{Region: "eu-west-1", MaxConns: 9, MaxBackoff: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	want := objstore.S3Options{Endpoint: "http://127.0.0.1:1", Region: "eu-west-1", PathStyle: true,
		MaxConns: 9, Timeout: 30 * time.Second, Attempts: 3, MaxBackoff: time.Second}
	if c.s3 != want {
		t.Errorf("got %+v\nwant %+v", c.s3, want)
	}
	if c, _ := cfgFor("s3://b/p", S3Options{Endpoint: "http://127.0.0.1:2", Timeout: time.Minute}); c.s3.Endpoint != "http://127.0.0.1:2" || c.s3.Timeout != time.Minute || c.s3.Attempts != 8 {
		t.Errorf("options over defaults: %+v", c.s3)
	}
	for _, bad := range []S3Options{{Timeout: -1}, {MaxConns: -1}, {MaxAttempts: -2}, {MaxBackoff: -time.Second}} {
		if _, err := cfgFor("s3://b/p", bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
