package server

import (
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"

	"github.com/labstack/echo/v4"
)

func (s *Server) consoleIndex(c echo.Context) error {
	return s.consoleFile(c, "index.html")
}

func (s *Server) consoleAsset(c echo.Context) error {
	name := c.Param("*")
	// fs.FS refuses "..", absolute and empty names itself; say so as a 404 without touching it.
	if !fs.ValidPath(name) || strings.Contains(name, "\\") {
		return notFound("file", name)
	}
	return s.consoleFile(c, path.Join("assets", name))
}

func (s *Server) consoleFile(c echo.Context, name string) error {
	if s.cfg.Console == nil {
		return problem(http.StatusNotFound, CodeNotFound, "", "this build has no web console")
	}
	b, err := fs.ReadFile(s.cfg.Console, name)
	if err != nil {
		return notFound("file", name)
	}
	ct := mime.TypeByExtension(path.Ext(name))
	if ct == "" {
		ct = "application/octet-stream"
	}
	h := c.Response().Header()
	// The console talks only to this origin and loads nothing from elsewhere.
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-cache")
	return c.Blob(http.StatusOK, ct, b)
}
