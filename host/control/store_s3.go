package control

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
)

// S3Options configures the s3:// store. Credentials come from the standard AWS chain.
type S3Options struct {
	Endpoint  string // e.g. http://127.0.0.1:7070 for a compatible server; "" for AWS
	Region    string // default us-east-1
	PathStyle bool
	Timeout   time.Duration // per request; default 30s
}

// S3Store keeps the control plane in a bucket. The generation of an object is its ETag; a
// conditional write is a PUT with If-None-Match: * (create) or If-Match: <etag> (replace),
// which S3 and compatible servers evaluate atomically and answer with 412 when they fail.
type S3Store struct {
	client *s3.Client
	bucket string
	prefix string
}

// OpenS3Store opens bucket/prefix.
func OpenS3Store(ctx context.Context, bucket, prefix string, o S3Options) (*S3Store, error) {
	if bucket == "" {
		return nil, errors.New("control: s3 URL needs a bucket: s3://bucket/prefix")
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	hc := awshttp.NewBuildableClient().WithTimeout(o.Timeout)
	cfg, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithHTTPClient(hc),
		awsconfig.WithRetryer(func() aws.Retryer {
			return retry.NewStandard(func(so *retry.StandardOptions) { so.MaxAttempts = 4 })
		}))
	if err != nil {
		return nil, fmt.Errorf("control: s3 config: %w", err)
	}
	if o.Region != "" {
		cfg.Region = o.Region
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
	if prefix != "" {
		prefix += "/"
	}
	return &S3Store{client: client, bucket: bucket, prefix: prefix}, nil
}

func (s *S3Store) key(name string) *string { return aws.String(s.prefix + name) }

func s3Err(op, name string, err error) error {
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
		return &StoreError{Op: op, Object: name, Err: fmt.Errorf("%w: %w", ErrConflict, err)}
	case status == http.StatusNotFound || code == "NoSuchKey" || code == "NotFound":
		return &StoreError{Op: op, Object: name, Err: fmt.Errorf("%w: %w", ErrNotFound, err)}
	}
	var ne net.Error
	retryable := status >= 500 || status == http.StatusTooManyRequests || status == http.StatusConflict ||
		errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, context.DeadlineExceeded)
	return &StoreError{Op: op, Object: name, Retryable: retryable, Err: err}
}

// Get implements ObjectStore.
func (s *S3Store) Get(ctx context.Context, name string) ([]byte, string, error) {
	if err := validObjectName(name); err != nil {
		return nil, "", err
	}
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: s.key(name)})
	if err != nil {
		return nil, "", s3Err("get", name, err)
	}
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	if err != nil {
		return nil, "", s3Err("get", name, err)
	}
	return b, aws.ToString(out.ETag), nil
}

// Put implements ObjectStore.
func (s *S3Store) Put(ctx context.Context, name string, data []byte, ifGen string) (string, error) {
	if err := validObjectName(name); err != nil {
		return "", err
	}
	in := &s3.PutObjectInput{Bucket: &s.bucket, Key: s.key(name), Body: bytes.NewReader(data), ContentLength: aws.Int64(int64(len(data)))}
	if ifGen == "" {
		in.IfNoneMatch = aws.String("*")
	} else {
		in.IfMatch = aws.String(ifGen)
	}
	out, err := s.client.PutObject(ctx, in)
	if err != nil {
		err = s3Err("put", name, err)
		if errors.Is(err, ErrNotFound) {
			// If-Match on an object that is gone: another writer deleted it.
			return "", &StoreError{Op: "put", Object: name, Err: fmt.Errorf("%w: %w", ErrConflict, err)}
		}
		return "", err
	}
	return aws.ToString(out.ETag), nil
}

// PutImmutable implements ObjectStore.
func (s *S3Store) PutImmutable(ctx context.Context, name string, data []byte) error {
	if err := validObjectName(name); err != nil {
		return err
	}
	_, err := s.client.PutObject(ctx, &s3.PutObjectInput{Bucket: &s.bucket, Key: s.key(name), Body: bytes.NewReader(data), ContentLength: aws.Int64(int64(len(data)))})
	if err != nil {
		return s3Err("put", name, err)
	}
	return nil
}

// Delete implements ObjectStore.
func (s *S3Store) Delete(ctx context.Context, name string) error {
	if err := validObjectName(name); err != nil {
		return err
	}
	_, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.bucket, Key: s.key(name)})
	if err != nil {
		if err = s3Err("delete", name, err); !errors.Is(err, ErrNotFound) {
			return err
		}
	}
	return nil
}

// Close implements ObjectStore.
func (s *S3Store) Close() error { return nil }
