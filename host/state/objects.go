package state

import (
	"context"
	"errors"
	"strings"
)

// Objects is a sub-namespace of a Store's durable pool for small whole objects that live next
// to the state: the pipeline's checkpoint records on s3:// pools. Names are relative to the
// prefix. Create is create-once (S3 If-None-Match: *), so an object's existence can be a
// commit point, and a writer that lost a race learns it.
type Objects struct {
	s      *Store
	prefix string
}

// ErrExists is a create-once write of a name that exists with other content.
var ErrExists = errors.New("state: object exists")

// Objects returns the pool's objects under prefix ("jobs/t/j/": a trailing '/' is added).
func (s *Store) Objects(prefix string) *Objects {
	if prefix != "" && !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return &Objects{s: s, prefix: prefix}
}

// Create writes name once. If it exists with exactly data (an earlier attempt of ours landed)
// it succeeds; if it exists with other content it fails with ErrExists.
func (o *Objects) Create(ctx context.Context, name string, data []byte) error {
	if err := o.s.acquire(ctx); err != nil {
		return err
	}
	defer o.s.release()
	_, err := o.s.os.put(ctx, o.prefix+name, data, putCond{ifAbsent: true})
	if errors.Is(err, errPrecondition) {
		got, gerr := o.s.os.get(ctx, o.prefix+name, 0, -1)
		if gerr == nil && string(got) == string(data) {
			return nil
		}
		return &Error{Op: "create", Object: o.prefix + name, Err: ErrExists}
	}
	return err
}

// Get reads name whole (ErrNotFound when missing).
func (o *Objects) Get(ctx context.Context, name string) ([]byte, error) {
	if err := o.s.acquire(ctx); err != nil {
		return nil, err
	}
	defer o.s.release()
	return o.s.os.get(ctx, o.prefix+name, 0, -1)
}

// List returns the names (relative to the prefix) that start with p, in no particular order.
func (o *Objects) List(ctx context.Context, p string) ([]string, error) {
	if err := o.s.acquire(ctx); err != nil {
		return nil, err
	}
	defer o.s.release()
	infos, err := o.s.os.list(ctx, o.prefix+p)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(infos))
	for _, in := range infos {
		names = append(names, strings.TrimPrefix(in.name, o.prefix))
	}
	return names, nil
}

// Delete removes name; removing a missing object is not an error.
func (o *Objects) Delete(ctx context.Context, name string) error {
	if err := o.s.acquire(ctx); err != nil {
		return err
	}
	defer o.s.release()
	return o.s.os.del(ctx, o.prefix+name)
}
