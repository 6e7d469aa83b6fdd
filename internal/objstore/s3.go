// Package objstore is a small S3 object client for the host's own records: whole-object GET,
// conditional PUT (create-once with If-None-Match: *, replace with If-Match: ETAG), LIST and
// DELETE, with typed errors that say whether trying again may help. The state tier keeps its
// own tuned client (ranged reads, pools, retry of broken bodies); this one is for small
// metadata objects, such as the pipeline runtime's checkpoint records.
package objstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
)

// Options configures an S3 client. Credentials come from the standard AWS chain.
type Options struct {
	Endpoint    string // an S3-compatible server, e.g. http://127.0.0.1:7070; "" for AWS
	Region      string // default: the AWS configuration's, else us-east-1
	PathStyle   bool
	Timeout     time.Duration // per attempt; default 30s
	MaxAttempts int           // default 4
}

// ParseURLOptions reads the options of an s3:// URL's query that configure the client
// (endpoint, region, path_style, timeout, max_attempts), ignoring the others (a state pool's
// URL carries the state tier's own).
func ParseURLOptions(q url.Values) (Options, error) {
	var o Options
	var err error
	o.Endpoint, o.Region = q.Get("endpoint"), q.Get("region")
	if v := q.Get("path_style"); v != "" {
		if o.PathStyle, err = strconv.ParseBool(v); err != nil {
			return o, fmt.Errorf("URL option path_style=%q: %w", v, err)
		}
	}
	if v := q.Get("timeout"); v != "" {
		if o.Timeout, err = time.ParseDuration(v); err != nil || o.Timeout <= 0 {
			return o, fmt.Errorf("URL option timeout=%q: want a positive duration", v)
		}
	}
	if v := q.Get("max_attempts"); v != "" {
		if o.MaxAttempts, err = strconv.Atoi(v); err != nil || o.MaxAttempts < 1 {
			return o, fmt.Errorf("URL option max_attempts=%q: want a whole number >= 1", v)
		}
	}
	return o, nil
}

// S3 is a bucket and key prefix.
type S3 struct {
	client *s3.Client
	bucket string
	prefix string // "" or "some/prefix/"
}

// Open returns a client of bucket/prefix. It sends no request.
func Open(ctx context.Context, bucket, prefix string, o Options) (*S3, error) {
	if bucket == "" {
		return nil, errors.New("objstore: an s3 URL needs a bucket: s3://bucket/prefix")
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 4
	}
	hc := awshttp.NewBuildableClient().WithTimeout(o.Timeout).
		WithDialerOptions(func(d *net.Dialer) { d.Timeout = min(o.Timeout, 10*time.Second) })
	opts := []func(*awsconfig.LoadOptions) error{
		awsconfig.WithHTTPClient(hc),
		awsconfig.WithRetryer(func() aws.Retryer {
			return retry.NewStandard(func(so *retry.StandardOptions) { so.MaxAttempts = o.MaxAttempts })
		}),
	}
	if o.Region != "" {
		opts = append(opts, awsconfig.WithRegion(o.Region))
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("objstore: s3 config: %w", err)
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	client := s3.NewFromConfig(cfg, func(so *s3.Options) {
		if o.Endpoint != "" {
			so.BaseEndpoint = aws.String(o.Endpoint)
		}
		so.UsePathStyle = o.PathStyle
		so.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
		so.DisableLogOutputChecksumValidationSkipped = true
	})
	prefix = strings.Trim(prefix, "/")
	if prefix != "" {
		prefix += "/"
	}
	return &S3{client: client, bucket: bucket, prefix: prefix}, nil
}

// Sentinels matched by errors.Is on an *Error.
var (
	ErrNotFound     = errors.New("object not found")
	ErrPrecondition = errors.New("precondition failed") // a conditional PUT lost
)

// Error is a failed request.
type Error struct {
	Op, Object string
	Status     int  // the HTTP status, 0 without a response
	Retryable  bool // a transient failure (5xx, throttling, the network): trying again may help
	Err        error
}

func (e *Error) Error() string { return fmt.Sprintf("s3 %s %s: %v", e.Op, e.Object, e.Err) }
func (e *Error) Unwrap() error { return e.Err }

func classify(op, name string, err error) error {
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
	e := &Error{Op: op, Object: name, Status: status, Err: err}
	switch {
	case status == http.StatusPreconditionFailed || code == "PreconditionFailed":
		e.Err = fmt.Errorf("%w: %w", ErrPrecondition, err)
	case status == http.StatusNotFound || code == "NoSuchKey" || code == "NotFound":
		e.Err = fmt.Errorf("%w: %w", ErrNotFound, err)
	default:
		var ne net.Error
		e.Retryable = status >= 500 || status == http.StatusTooManyRequests || status == http.StatusConflict ||
			errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, context.DeadlineExceeded)
	}
	return e
}

func (s *S3) key(name string) *string { return aws.String(s.prefix + name) }

// Get returns an object and its ETag.
func (s *S3) Get(ctx context.Context, name string) ([]byte, string, error) {
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: s.key(name)})
	if err != nil {
		return nil, "", classify("get", name, err)
	}
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	if err != nil {
		return nil, "", classify("get", name, err)
	}
	return b, aws.ToString(out.ETag), nil
}

// Cond is a PUT's precondition.
type Cond struct {
	Create bool   // only if the object does not exist (If-None-Match: *)
	Match  string // only if the object has this ETag (If-Match)
}

// Put writes an object under cond and returns its ETag. A failed condition is ErrPrecondition;
// If-Match on an object that is gone is ErrPrecondition too (another writer deleted it).
func (s *S3) Put(ctx context.Context, name string, data []byte, cond Cond) (string, error) {
	in := &s3.PutObjectInput{Bucket: &s.bucket, Key: s.key(name), Body: bytes.NewReader(data), ContentLength: aws.Int64(int64(len(data)))}
	switch {
	case cond.Create:
		in.IfNoneMatch = aws.String("*")
	case cond.Match != "":
		in.IfMatch = aws.String(cond.Match)
	}
	out, err := s.client.PutObject(ctx, in)
	if err != nil {
		err = classify("put", name, err)
		if cond.Match != "" && errors.Is(err, ErrNotFound) {
			return "", &Error{Op: "put", Object: name, Status: http.StatusNotFound, Err: fmt.Errorf("%w: %w", ErrPrecondition, err)}
		}
		return "", err
	}
	return aws.ToString(out.ETag), nil
}

// List returns the names (without the client's prefix) of the objects under prefix, in
// lexical order.
func (s *S3) List(ctx context.Context, prefix string) ([]string, error) {
	var names []string
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: &s.bucket, Prefix: aws.String(s.prefix + prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, classify("list", prefix, err)
		}
		for _, o := range page.Contents {
			names = append(names, strings.TrimPrefix(aws.ToString(o.Key), s.prefix))
		}
	}
	return names, nil
}

// Delete removes an object; one that does not exist is not an error.
func (s *S3) Delete(ctx context.Context, name string) error {
	_, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.bucket, Key: s.key(name)})
	if err != nil {
		if err = classify("delete", name, err); !errors.Is(err, ErrNotFound) {
			return err
		}
	}
	return nil
}
