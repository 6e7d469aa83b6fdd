// Package uring is an experimental io_uring layer: a completion reactor for file and socket
// operations, and a BlockReader for the state tier's segment files, with a portable goroutine
// pool behind the same API.
package uring
