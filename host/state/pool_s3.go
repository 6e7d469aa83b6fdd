package state

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
)

// s3Store is the s3:// pool. Requests go through aws-sdk-go-v2 with the standard credential
// chain, a bounded connection pool, a per-attempt timeout (covering the body), and the SDK's
// standard retryer (5xx, SlowDown and other throttling, timeouts, broken connections) with
// jittered exponential backoff and no client-side retry quota. Reading a response body happens
// after the SDK returns, so a body that breaks or stalls is retried here, with the same budget.
//
// Conditional writes use If-None-Match: * (create a manifest or lineage head only if absent) and
// If-Match: <etag> (replace the lineage head only if nobody else did), which S3 and compatible
// servers evaluate atomically; a failed condition is HTTP 412.
type s3Store struct {
	client      *s3.Client
	bucket      string
	prefix      string // "" or "some/prefix/"
	timeout     time.Duration
	maxAttempts int
	maxBackoff  time.Duration
}

func openS3Store(ctx context.Context, bucket, prefix string, cfg *config) (*s3Store, error) {
	if bucket == "" {
		return nil, fmt.Errorf("state: s3 URL needs a bucket: s3://bucket/prefix")
	}
	// A caller's client is installed on the S3 client directly (below), not through the config
	// loader, which would try to graft AWS_CA_BUNDLE onto its transport.
	var custom *http.Client
	if hc := cfg.s3HTTPClient; hc != nil {
		c := *hc
		if c.Timeout == 0 {
			c.Timeout = cfg.s3Timeout
		}
		custom = &c
	}
	n := cfg.s3MaxConns
	var httpClient aws.HTTPClient = awshttp.NewBuildableClient().
		WithTimeout(cfg.s3Timeout).
		WithDialerOptions(func(d *net.Dialer) { d.Timeout = min(cfg.s3Timeout, 10*time.Second) }).
		WithTransportOptions(func(t *http.Transport) {
			t.MaxConnsPerHost = n
			t.MaxIdleConns = n
			t.MaxIdleConnsPerHost = n
			t.IdleConnTimeout = 90 * time.Second
			t.ResponseHeaderTimeout = cfg.s3Timeout
		})
	opts := []func(*awsconfig.LoadOptions) error{
		awsconfig.WithHTTPClient(httpClient),
		awsconfig.WithRetryer(func() aws.Retryer {
			return retry.NewStandard(func(o *retry.StandardOptions) {
				o.MaxAttempts = cfg.s3MaxAttempts
				o.MaxBackoff = cfg.s3MaxBackoff
				o.RateLimiter = ratelimit.None
				// A conflicting concurrent conditional write (409) is transient.
				o.Retryables = append(o.Retryables, retry.RetryableErrorCode{
					Codes: map[string]struct{}{"ConditionalRequestConflict": {}},
				})
			})
		}),
	}
	if cfg.s3Region != "" {
		opts = append(opts, awsconfig.WithRegion(cfg.s3Region))
	}
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("state: s3 config: %w", err)
	}
	if awsCfg.Region == "" {
		awsCfg.Region = "us-east-1"
	}
	client := s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		if cfg.s3Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.s3Endpoint)
		}
		o.UsePathStyle = cfg.s3PathStyle
		if custom != nil {
			o.HTTPClient = custom
		}
		// Our own checksums cover every byte we read; the SDK's response validation would only
		// log that ranged GETs carry no checksum.
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
		o.DisableLogOutputChecksumValidationSkipped = true
	})
	if prefix != "" {
		prefix += "/"
	}
	return &s3Store{
		client: client, bucket: bucket, prefix: prefix, timeout: cfg.s3Timeout,
		maxAttempts: cfg.s3MaxAttempts, maxBackoff: cfg.s3MaxBackoff,
	}, nil
}

func (s *s3Store) key(name string) *string { return aws.String(s.prefix + name) }

// s3Err classifies an SDK error into the package vocabulary.
func s3Err(op, name string, err error) error {
	if err == nil {
		return nil
	}
	var re *awshttp.ResponseError
	status := 0
	if errors.As(err, &re) {
		status = re.HTTPStatusCode()
	}
	code := ""
	var ae smithy.APIError
	if errors.As(err, &ae) {
		code = ae.ErrorCode()
	}
	switch {
	case status == http.StatusPreconditionFailed || code == "PreconditionFailed":
		return errPrecondition
	case status == http.StatusNotFound || code == "NoSuchKey" || code == "NotFound":
		return &Error{Op: op, Object: name, Err: fmt.Errorf("%w: %w", ErrNotFound, err)}
	case errors.Is(err, context.Canceled):
		return &Error{Op: op, Object: name, Err: err}
	}
	retryable := status >= 500 || status == http.StatusTooManyRequests || status == http.StatusConflict ||
		code == "SlowDown" || code == "RequestTimeout" || errors.Is(err, context.DeadlineExceeded) ||
		retry.IsErrorRetryables(retry.DefaultRetryables).IsErrorRetryable(err) == aws.TrueTernary
	var ne net.Error
	if errors.As(err, &ne) {
		retryable = true
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		retryable = true
	}
	return &Error{Op: op, Object: name, Retryable: retryable, Err: err}
}

// backoff sleeps before attempt (1-based) with full jitter, or returns ctx's error.
func (s *s3Store) backoff(ctx context.Context, attempt int) error {
	d := min(s.maxBackoff, 50*time.Millisecond<<min(attempt, 10))
	t := time.NewTimer(rand.N(d) + time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *s3Store) get(ctx context.Context, name string, off, n int64) ([]byte, error) {
	if n == 0 {
		return []byte{}, nil
	}
	in := &s3.GetObjectInput{Bucket: &s.bucket, Key: s.key(name)}
	if off > 0 || n > 0 {
		if n > 0 {
			in.Range = aws.String(fmt.Sprintf("bytes=%d-%d", off, off+n-1))
		} else {
			in.Range = aws.String(fmt.Sprintf("bytes=%d-", off))
		}
	}
	var last error
	for attempt := 1; attempt <= s.maxAttempts; attempt++ {
		b, err := s.getOnce(ctx, in, n)
		if err == nil {
			return b, nil
		}
		last = s3Err("get", name, err)
		if !IsRetryable(last) || ctx.Err() != nil {
			return nil, last
		}
		if err := s.backoff(ctx, attempt); err != nil {
			return nil, s3Err("get", name, err)
		}
	}
	return nil, last
}

// getOnce is one GET whose body is read to the end under the attempt timeout. The SDK has
// already retried the request itself; a failure while reading the body surfaces here.
func (s *s3Store) getOnce(ctx context.Context, in *s3.GetObjectInput, n int64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout*time.Duration(s.maxAttempts))
	defer cancel()
	out, err := s.client.GetObject(ctx, in)
	if err != nil {
		return nil, err
	}
	defer out.Body.Close()
	var buf bytes.Buffer
	if n > 0 {
		buf.Grow(int(n))
	} else if out.ContentLength != nil && *out.ContentLength > 0 {
		buf.Grow(int(*out.ContentLength))
	}
	if _, err := buf.ReadFrom(out.Body); err != nil {
		return nil, err
	}
	if out.ContentLength != nil && int64(buf.Len()) != *out.ContentLength {
		return nil, io.ErrUnexpectedEOF
	}
	return buf.Bytes(), nil
}

func (s *s3Store) put(ctx context.Context, name string, data []byte, c putCond) (string, error) {
	in := &s3.PutObjectInput{
		Bucket: &s.bucket, Key: s.key(name),
		Body: bytes.NewReader(data), ContentLength: aws.Int64(int64(len(data))),
	}
	if c.ifAbsent {
		in.IfNoneMatch = aws.String("*")
	}
	if c.ifMatch != "" {
		in.IfMatch = aws.String(c.ifMatch)
	}
	var last error
	for attempt := 1; attempt <= s.maxAttempts; attempt++ {
		out, err := s.client.PutObject(ctx, in)
		if err == nil {
			return aws.ToString(out.ETag), nil
		}
		last = s3Err("put", name, err)
		if errors.Is(last, errPrecondition) || !IsRetryable(last) || ctx.Err() != nil {
			return "", last
		}
		// The SDK gave up on its attempts (each already backed off); one more round after a
		// pause covers an outage longer than its budget without retrying forever.
		if attempt >= 2 {
			return "", last
		}
		if err := s.backoff(ctx, attempt+3); err != nil {
			return "", s3Err("put", name, err)
		}
		in.Body = bytes.NewReader(data)
	}
	return "", last
}

func (s *s3Store) head(ctx context.Context, name string) (objectInfo, error) {
	out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.bucket, Key: s.key(name)})
	if err != nil {
		return objectInfo{}, s3Err("head", name, err)
	}
	return objectInfo{
		name: name, size: aws.ToInt64(out.ContentLength),
		modTime: aws.ToTime(out.LastModified), etag: aws.ToString(out.ETag),
	}, nil
}

func (s *s3Store) list(ctx context.Context, prefix string) ([]objectInfo, error) {
	var out []objectInfo
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: &s.bucket, Prefix: s.key(prefix)})
	for pages := 0; p.HasMorePages(); pages++ {
		if pages > 1<<20 {
			return nil, &Error{Op: "list", Object: prefix, Err: errors.New("too many pages")}
		}
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, s3Err("list", prefix, err)
		}
		for _, o := range page.Contents {
			out = append(out, objectInfo{
				name: strings.TrimPrefix(aws.ToString(o.Key), s.prefix), size: aws.ToInt64(o.Size),
				modTime: aws.ToTime(o.LastModified), etag: aws.ToString(o.ETag),
			})
		}
	}
	return out, nil
}

func (s *s3Store) del(ctx context.Context, name string) error {
	_, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.bucket, Key: s.key(name)})
	if err = s3Err("delete", name, err); err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	return nil
}

func (s *s3Store) close() error { return nil }
