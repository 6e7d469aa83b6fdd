// Package web holds the web console: hand-written HTML, CSS and JavaScript in dist/, embedded
// in the binary and served by host/server at /. It loads nothing from anywhere but its own
// origin, so it works offline, and it calls only the public REST API.
package web

import (
	"embed"
	"io/fs"
)

//go:embed dist
var dist embed.FS

// Dist is the console's files: index.html and assets/.
func Dist() fs.FS {
	sub, err := fs.Sub(dist, "dist")
	if err != nil {
		panic(err) // dist is embedded at build time
	}
	return sub
}
