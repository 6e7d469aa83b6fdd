package control

import (
	"context"
	"time"

	"github.com/clink-wasm/clink-wasm/internal/objstore"
)

// S3Options configures the s3:// store. Credentials come from the standard AWS chain.
type S3Options struct {
	Endpoint  string // e.g. http://127.0.0.1:7070 for a compatible server; "" for AWS
	Region    string // default us-east-1
	PathStyle bool
	Timeout   time.Duration // per attempt; default 30s
}

// S3Store keeps the control plane in a bucket: internal/objstore's S3 pool. The generation of
// an object is its ETag; a conditional write is a PUT with If-None-Match: * (create) or
// If-Match: <etag> (replace), which S3 and compatible servers evaluate atomically and answer
// with 412 when they fail. Requests are retried (4 attempts) when the failure is transient.
type S3Store struct{ store }

// OpenS3Store opens bucket/prefix.
func OpenS3Store(ctx context.Context, bucket, prefix string, o S3Options) (*S3Store, error) {
	st, err := objstore.OpenS3(ctx, bucket, prefix, objstore.S3Options{
		Endpoint: o.Endpoint, Region: o.Region, PathStyle: o.PathStyle, Timeout: o.Timeout, Attempts: 4,
	})
	if err != nil {
		return nil, storeErr(err)
	}
	return &S3Store{store{st}}, nil
}
