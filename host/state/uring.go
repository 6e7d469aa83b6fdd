package state

import "fmt"

// newUringReader returns the io_uring block reader of the file pool. host/uring does not exist
// yet, so the option reports that it is unavailable.
func newUringReader() (blockReader, error) {
	return nil, fmt.Errorf("state: io_uring reads are not available in this build")
}
