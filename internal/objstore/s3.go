package objstore

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

// S3Options configures an S3 pool. Credentials come from the standard AWS chain. Zero fields
// take the defaults named on them.
type S3Options struct {
	Endpoint   string        // an S3-compatible server, e.g. http://127.0.0.1:7070; "" for AWS
	Region     string        // "" = from the AWS configuration chain, else us-east-1
	PathStyle  bool          // bucket in the path, which most compatible servers need
	MaxConns   int           // connection pool bound; default 64
	Timeout    time.Duration // one attempt, request and body; default 30s
	Attempts   int           // attempts per request; default 8
	MaxBackoff time.Duration // backoff cap between attempts; default 5s
	// HTTPClient replaces the built transport (fault injection, custom TLS). The pool still
	// applies Timeout (when the client has none) and its retries.
	HTTPClient *http.Client
}

// S3 is the S3 pool. Requests go through aws-sdk-go-v2 with a bounded connection pool, a
// per-attempt timeout (covering the body), and the SDK's standard retryer (5xx, SlowDown and
// other throttling, timeouts, broken connections) with jittered exponential backoff and no
// client-side retry quota. Reading a response body happens after the SDK returns, so a body
// that breaks or stalls is retried here, with the same budget.
//
// Conditional writes use If-None-Match: * and If-Match: <etag>, which S3 and compatible
// servers evaluate atomically; a failed condition is HTTP 412, returned as ErrPrecondition.
type S3 struct {
	client      *s3.Client
	bucket      string
	prefix      string // "" or "some/prefix/"
	timeout     time.Duration
	maxAttempts int
	maxBackoff  time.Duration
}

// OpenS3 opens the pool bucket/prefix.
func OpenS3(ctx context.Context, bucket, prefix string, o S3Options) (*S3, error) {
	if bucket == "" {
		return nil, errors.New("objstore: s3 URL needs a bucket: s3://bucket/prefix")
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 64
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	if o.Attempts <= 0 {
		o.Attempts = 8
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 5 * time.Second
	}
	// A caller's client is installed on the S3 client directly (below), not through the config
	// loader, which would try to graft AWS_CA_BUNDLE onto its transport.
	var custom *http.Client
	if hc := o.HTTPClient; hc != nil {
		c := *hc
		if c.Timeout == 0 {
			c.Timeout = o.Timeout
		}
		custom = &c
	}
	n := o.MaxConns
	var httpClient aws.HTTPClient = awshttp.NewBuildableClient().
		WithTimeout(o.Timeout).
		WithDialerOptions(func(d *net.Dialer) { d.Timeout = min(o.Timeout, 10*time.Second) }).
		WithTransportOptions(func(t *http.Transport) {
			t.MaxConnsPerHost = n
			t.MaxIdleConns = n
			t.MaxIdleConnsPerHost = n
			t.IdleConnTimeout = 90 * time.Second
			t.ResponseHeaderTimeout = o.Timeout
		})
	opts := []func(*awsconfig.LoadOptions) error{
		awsconfig.WithHTTPClient(httpClient),
		awsconfig.WithRetryer(func() aws.Retryer {
			return retry.NewStandard(func(so *retry.StandardOptions) {
				so.MaxAttempts = o.Attempts
				so.MaxBackoff = o.MaxBackoff
				so.RateLimiter = ratelimit.None
				// A conflicting concurrent conditional write (409) is transient.
				so.Retryables = append(so.Retryables, retry.RetryableErrorCode{
					Codes: map[string]struct{}{"ConditionalRequestConflict": {}},
				})
			})
		}),
	}
	if o.Region != "" {
		opts = append(opts, awsconfig.WithRegion(o.Region))
	}
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("objstore: s3 config: %w", err)
	}
	if awsCfg.Region == "" {
		awsCfg.Region = "us-east-1"
	}
	client := s3.NewFromConfig(awsCfg, func(so *s3.Options) {
		if o.Endpoint != "" {
			so.BaseEndpoint = aws.String(o.Endpoint)
		}
		so.UsePathStyle = o.PathStyle
		if custom != nil {
			so.HTTPClient = custom
		}
		// Callers checksum what they read; the SDK's response validation would only log that
		// ranged GETs carry no checksum.
		so.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
		so.DisableLogOutputChecksumValidationSkipped = true
	})
	if prefix != "" {
		prefix += "/"
	}
	return &S3{
		client: client, bucket: bucket, prefix: prefix, timeout: o.Timeout,
		maxAttempts: o.Attempts, maxBackoff: o.MaxBackoff,
	}, nil
}

func (s *S3) key(name string) *string { return aws.String(s.prefix + name) }

// s3Err classifies an SDK error: ErrPrecondition, ErrNotFound, or an *Error that knows whether
// a retry may help.
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
		return ErrPrecondition
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
func (s *S3) backoff(ctx context.Context, attempt int) error {
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

// Get implements Store.
func (s *S3) Get(ctx context.Context, name string, off, n int64) ([]byte, error) {
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
	b, _, err := s.get(ctx, name, in, n)
	return b, err
}

// Read implements Store: the ETag is the one the GET's response carries.
func (s *S3) Read(ctx context.Context, name string) ([]byte, string, error) {
	if err := ValidName(name); err != nil {
		return nil, "", err
	}
	return s.get(ctx, name, &s3.GetObjectInput{Bucket: &s.bucket, Key: s.key(name)}, -1)
}

func (s *S3) get(ctx context.Context, name string, in *s3.GetObjectInput, n int64) ([]byte, string, error) {
	var last error
	for attempt := 1; attempt <= s.maxAttempts; attempt++ {
		b, etag, err := s.getOnce(ctx, in, n)
		if err == nil {
			return b, etag, nil
		}
		last = s3Err("get", name, err)
		if !IsRetryable(last) || ctx.Err() != nil {
			return nil, "", last
		}
		if err := s.backoff(ctx, attempt); err != nil {
			return nil, "", s3Err("get", name, err)
		}
	}
	return nil, "", last
}

// getOnce is one GET whose body is read to the end under the attempt timeout. The SDK has
// already retried the request itself; a failure while reading the body surfaces here.
func (s *S3) getOnce(ctx context.Context, in *s3.GetObjectInput, n int64) ([]byte, string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout*time.Duration(s.maxAttempts))
	defer cancel()
	out, err := s.client.GetObject(ctx, in)
	if err != nil {
		return nil, "", err
	}
	defer out.Body.Close()
	if out.ContentLength != nil && *out.ContentLength >= 0 {
		// The size is known: read into one exact allocation. (bytes.Buffer.ReadFrom, even
		// grown to the size first, needs 512 bytes free to see the end, so it reallocated and
		// copied every body: a third of the bytes a cold run allocated.)
		b := make([]byte, *out.ContentLength)
		if _, err := io.ReadFull(out.Body, b); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, "", err
		}
		return b, aws.ToString(out.ETag), nil
	}
	var buf bytes.Buffer
	if n > 0 {
		buf.Grow(int(n))
	}
	if _, err := buf.ReadFrom(out.Body); err != nil {
		return nil, "", err
	}
	return buf.Bytes(), aws.ToString(out.ETag), nil
}

// Put implements Store.
func (s *S3) Put(ctx context.Context, name string, data []byte, c Cond) (string, error) {
	if err := ValidName(name); err != nil {
		return "", err
	}
	in := &s3.PutObjectInput{
		Bucket: &s.bucket, Key: s.key(name),
		Body: bytes.NewReader(data), ContentLength: aws.Int64(int64(len(data))),
	}
	if c.IfAbsent {
		in.IfNoneMatch = aws.String("*")
	}
	if c.IfMatch != "" {
		in.IfMatch = aws.String(c.IfMatch)
	}
	var last error
	for attempt := 1; attempt <= s.maxAttempts; attempt++ {
		out, err := s.client.PutObject(ctx, in)
		if err == nil {
			return aws.ToString(out.ETag), nil
		}
		last = s3Err("put", name, err)
		if errors.Is(last, ErrPrecondition) || !IsRetryable(last) || ctx.Err() != nil {
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

// Head implements Store.
func (s *S3) Head(ctx context.Context, name string) (Info, error) {
	out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.bucket, Key: s.key(name)})
	if err != nil {
		return Info{}, s3Err("head", name, err)
	}
	return Info{
		Name: name, Size: aws.ToInt64(out.ContentLength),
		ModTime: aws.ToTime(out.LastModified), ETag: aws.ToString(out.ETag),
	}, nil
}

// List implements Store with a paginated ListObjectsV2.
func (s *S3) List(ctx context.Context, prefix string) ([]Info, error) {
	var out []Info
	err := s.list(ctx, "list", prefix, func(o Info) { out = append(out, o) })
	return out, err
}

func (s *S3) list(ctx context.Context, op, prefix string, fn func(Info)) error {
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: &s.bucket, Prefix: s.key(prefix)})
	for pages := 0; p.HasMorePages(); pages++ {
		if pages > 1<<20 {
			return &Error{Op: op, Object: prefix, Err: errors.New("too many pages")}
		}
		page, err := p.NextPage(ctx)
		if err != nil {
			return s3Err(op, prefix, err)
		}
		for _, o := range page.Contents {
			fn(Info{
				Name: strings.TrimPrefix(aws.ToString(o.Key), s.prefix), Size: aws.ToInt64(o.Size),
				ModTime: aws.ToTime(o.LastModified), ETag: aws.ToString(o.ETag),
			})
		}
	}
	return nil
}

// Usage returns the bytes and the number of objects under the directory prefix names
// ("state/acme/"), from a paginated listing.
func (s *S3) Usage(ctx context.Context, prefix string) (bytes, objects int64, err error) {
	if err := ValidName(strings.TrimSuffix(prefix, "/")); err != nil {
		return 0, 0, err
	}
	err = s.list(ctx, "usage", strings.TrimSuffix(prefix, "/")+"/", func(o Info) {
		bytes += o.Size
		objects++
	})
	if err != nil {
		return 0, 0, err
	}
	return bytes, objects, nil
}

// Delete implements Store.
func (s *S3) Delete(ctx context.Context, name string) error {
	_, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.bucket, Key: s.key(name)})
	if err = s3Err("delete", name, err); err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	return nil
}

// Close implements Store.
func (s *S3) Close() error { return nil }
