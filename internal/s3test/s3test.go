// Package s3test finds the loopback S3 test server (versitygw) that scripts/with-s3.sh or
// scripts/s3-up.sh started, for tests of the S3 pools.
package s3test

import (
	"net/url"
	"os"
	"testing"
)

// Endpoint returns the test server's endpoint and bucket. Without CLINK_TEST_S3_ENDPOINT it
// returns ok false, except under CI=true, where it fails t: CI must not skip the S3 tests
// silently. An endpoint that is not on loopback fails t: tests never leave the machine.
func Endpoint(t testing.TB) (endpoint, bucket string, ok bool) {
	t.Helper()
	ep := os.Getenv("CLINK_TEST_S3_ENDPOINT")
	if ep == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal(Missing)
		}
		return "", "", false
	}
	u, err := url.Parse(ep)
	if err != nil || (u.Hostname() != "127.0.0.1" && u.Hostname() != "localhost" && u.Hostname() != "::1") {
		t.Fatalf("CLINK_TEST_S3_ENDPOINT must be a loopback URL, got %q", ep)
	}
	bucket = os.Getenv("CLINK_TEST_S3_BUCKET")
	if bucket == "" {
		bucket = "clink-test"
	}
	return ep, bucket, true
}

// Missing is the message of a test skipped for want of the server.
const Missing = "S3 tests need a server: scripts/with-s3.sh go test ... (or eval \"$(scripts/s3-up.sh)\", which sets CLINK_TEST_S3_ENDPOINT)"
