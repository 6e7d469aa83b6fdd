// Package devkit is the operator author's workflow behind `clink-wasm new`, `build` and
// `test`: scaffold a project in any SDK language, build it with the right toolchain and flags
// into a module with its manifest embedded, and run a table of test cases against the module
// in the production host: the async execution controller (host/scheduler) over the module,
// with a seeded in-memory state backend and scripted lookups (see [RunTable]). FromRecording
// turns a recording (host/replay) into such a table.
//
// A project is a directory with a clink.json ([Project]), the operator's source, its manifest
// (manifest.json), a test table (tests.json, see [Case]) and a sample input. Build and Test need
// no arguments inside it.
package devkit

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
)

// Languages are the SDK languages a project can be written in.
var Languages = []string{"go", "as", "c", "rust"}

// ProjectFile is the name of a project's description.
const ProjectFile = "clink.json"

// Project is a project's clink.json.
type Project struct {
	// Lang is the SDK language: go, as, c or rust.
	Lang string `json:"lang"`
	// Name is the operator's name (its manifest name) and the module's base name.
	Name string `json:"name"`
	// SDK is the absolute path of the guest-sdk directory of a clink-wasm checkout: where the
	// build finds the SDK of its language.
	SDK string `json:"sdk"`
	// Key is the field records are keyed by in `clink-wasm run --key` and in the test table
	// (default "user").
	Key string `json:"key,omitempty"`
}

// Module is the path of the project's built module, relative to the project.
func (p *Project) Module() string { return p.Name + ".wasm" }

var nameRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]{0,63}$`)

// ErrNotProject is returned by LoadProject for a directory without a clink.json.
var ErrNotProject = errors.New("not a clink-wasm project (no " + ProjectFile + "; create one with `clink-wasm new`)")

// LoadProject reads dir/clink.json.
func LoadProject(dir string) (*Project, error) {
	b, err := os.ReadFile(filepath.Join(dir, ProjectFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", dir, ErrNotProject)
	}
	if err != nil {
		return nil, err
	}
	var p Project
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, ProjectFile), err)
	}
	if err := p.validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, ProjectFile), err)
	}
	if p.Key == "" {
		p.Key = "user"
	}
	return &p, nil
}

func (p *Project) validate() error {
	if !slices.Contains(Languages, p.Lang) {
		return fmt.Errorf("lang %q: want one of %v", p.Lang, Languages)
	}
	if !nameRE.MatchString(p.Name) {
		return fmt.Errorf("name %q: want a letter, then up to 63 of [A-Za-z0-9_-]", p.Name)
	}
	if !filepath.IsAbs(p.SDK) {
		return fmt.Errorf("sdk %q: want the absolute path of a clink-wasm guest-sdk directory", p.SDK)
	}
	return nil
}

// FindSDK returns the guest-sdk directory to scaffold against: explicit if given, else
// $CLINK_SDK, else the first guest-sdk directory found walking up from each of the start
// directories (the working directory, the executable's directory).
func FindSDK(explicit string, start ...string) (string, error) {
	check := func(dir string) (string, bool) {
		abs, err := filepath.Abs(dir)
		if err != nil {
			return "", false
		}
		if st, err := os.Stat(filepath.Join(abs, "c", "clink.h")); err == nil && !st.IsDir() {
			return abs, true
		}
		return "", false
	}
	for _, d := range []string{explicit, os.Getenv("CLINK_SDK")} {
		if d == "" {
			continue
		}
		if abs, ok := check(d); ok {
			return abs, nil
		}
		return "", fmt.Errorf("%s is not a clink-wasm guest-sdk directory (no c/clink.h)", d)
	}
	for _, s := range start {
		for d := s; ; d = filepath.Dir(d) {
			if abs, ok := check(filepath.Join(d, "guest-sdk")); ok {
				return abs, nil
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	return "", errors.New("cannot find the clink-wasm guest SDKs: give --sdk PATH/TO/clink-wasm/guest-sdk or set CLINK_SDK")
}
