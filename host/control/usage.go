package control

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// UsageStore is an object store that can say how many bytes live under a prefix: what the
// server measures a tenant's durable state with (the state_bytes quota). Both stores here are
// UsageStores.
type UsageStore interface {
	// Usage returns the total size in bytes and the number of objects whose names start with
	// prefix (a directory-like prefix ending in "/").
	Usage(ctx context.Context, prefix string) (bytes, objects int64, err error)
}

// TenantStatePrefix is the prefix under which StateURL places every pipeline pool of tenant,
// relative to the data URL (the control store's root).
func TenantStatePrefix(tenant string) (string, error) {
	if !ValidTenantName(tenant) {
		return "", errors.New("control: " + tenant + " is not a tenant name")
	}
	return "state/" + tenant + "/", nil
}

// Usage implements UsageStore: a walk of the directory the prefix names (temporaries and the
// lock file included: they occupy the disk too). A missing directory is 0 bytes.
func (s *FileStore) Usage(ctx context.Context, prefix string) (int64, int64, error) {
	if err := validObjectName(strings.TrimSuffix(prefix, "/")); err != nil {
		return 0, 0, err
	}
	root := filepath.Join(s.root, filepath.FromSlash(strings.TrimSuffix(prefix, "/")))
	var n, objs int64
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while we walk (garbage collection), or never created
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			if err != nil {
				return err
			}
			n += info.Size()
			objs++
		}
		return nil
	})
	if err != nil {
		return 0, 0, fileErr("usage", prefix, err)
	}
	return n, objs, nil
}

// Usage implements UsageStore with a paginated ListObjectsV2 of the prefix.
func (s *S3Store) Usage(ctx context.Context, prefix string) (int64, int64, error) {
	if err := validObjectName(strings.TrimSuffix(prefix, "/")); err != nil {
		return 0, 0, err
	}
	var n, objs int64
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: aws.String(s.bucket), Prefix: s.key(prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return 0, 0, s3Err("usage", prefix, err)
		}
		for _, o := range page.Contents {
			n += aws.ToInt64(o.Size)
			objs++
		}
	}
	return n, objs, nil
}
