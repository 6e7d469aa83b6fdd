package control

import (
	"context"
	"errors"
)

// UsageStore is an object store that can say how many bytes live under a prefix: what the
// server measures a tenant's durable state with (the state_bytes quota). Both stores here are
// UsageStores: file:// walks the directory (temporaries included: they occupy the disk too),
// s3:// sums a paginated listing.
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
