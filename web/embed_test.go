package web

import (
	"io/fs"
	"regexp"
	"strings"
	"testing"
)

// TestConsoleIsSelfContained: every file index.html names is embedded, and nothing in the
// console refers to another origin, so it works offline.
func TestConsoleIsSelfContained(t *testing.T) {
	d := Dist()
	index, err := fs.ReadFile(d, "index.html")
	if err != nil {
		t.Fatal(err)
	}
	refs := regexp.MustCompile(`(?:src|href)="([^"]+)"`).FindAllStringSubmatch(string(index), -1)
	if len(refs) < 2 {
		t.Fatalf("index.html names %d files", len(refs))
	}
	for _, r := range refs {
		name := strings.TrimPrefix(r[1], "/")
		if _, err := fs.Stat(d, name); err != nil {
			t.Errorf("index.html names %s, which is not embedded", r[1])
		}
	}
	offOrigin := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/|@import|url\(\s*["']?https?:`)
	fs.WalkDir(d, ".", func(p string, de fs.DirEntry, err error) error {
		if err != nil || de.IsDir() {
			return err
		}
		b, _ := fs.ReadFile(d, p)
		if m := offOrigin.Find(b); m != nil {
			t.Errorf("%s refers to another origin: %s", p, m)
		}
		return nil
	})
}
