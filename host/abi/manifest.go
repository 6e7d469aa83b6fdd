package abi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
)

// ManifestSection is the name of the custom section that may carry the manifest.
const ManifestSection = "clink.manifest"

// Limits on what a manifest may declare (docs/abi.md, "Declaring the module").
const (
	MaxStates    = 256
	MaxPrefetch  = 16
	MaxEndpoints = 64
	maxManifest  = 64 << 10
)

// Manifest is what a module declares about itself: ABI version, name and capabilities.
type Manifest struct {
	ABI       int      `json:"abi"`
	Name      string   `json:"name"`
	States    []string `json:"states,omitempty"`
	Prefetch  []string `json:"prefetch,omitempty"`
	Endpoints []string `json:"endpoints,omitempty"`
	// StateVersion is the version of the format of the module's state values (0: unversioned).
	// A checkpoint records it; a restore into another version needs MigratesFrom.
	StateVersion int `json:"state_version,omitempty"`
	// MigratesFrom lists the state versions the module reads and converts as it meets them
	// (its own migration), so that it may restore their checkpoints.
	MigratesFrom []int `json:"migrates_from,omitempty"`
}

// MaxMigratesFrom bounds a manifest's migrates_from.
const MaxMigratesFrom = 64

var (
	operatorNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
	stateNameRE    = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)
)

// ParseManifest decodes and validates a manifest. The error says what is wrong in terms a guest
// author can act on.
func ParseManifest(b []byte) (Manifest, error) {
	var m Manifest
	if len(b) > maxManifest {
		return m, fmt.Errorf("manifest is %d bytes; the limit is %d", len(b), maxManifest)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&m); err != nil {
		return m, fmt.Errorf("manifest is not valid JSON: %w", err)
	}
	if dec.More() {
		return m, errors.New("manifest has trailing data after the JSON object")
	}
	return m, m.Validate()
}

// Validate checks the manifest against docs/abi.md.
func (m Manifest) Validate() error {
	if m.ABI != Version {
		if m.ABI == 0 {
			return errors.New(`manifest lacks "abi" (the ABI version; this host supports 1)`)
		}
		return fmt.Errorf("module targets clink ABI v%d; this host supports v%d", m.ABI, Version)
	}
	if !operatorNameRE.MatchString(m.Name) {
		return fmt.Errorf("manifest name %q is invalid: use 1-64 characters of [A-Za-z0-9_.-]", m.Name)
	}
	if err := checkNames("states", m.States, MaxStates); err != nil {
		return err
	}
	if err := checkNames("prefetch", m.Prefetch, MaxPrefetch); err != nil {
		return err
	}
	for _, p := range m.Prefetch {
		if m.stateIndex(p) < 0 {
			return fmt.Errorf("manifest prefetches %q, which is not among its states", p)
		}
	}
	if err := checkNames("endpoints", m.Endpoints, MaxEndpoints); err != nil {
		return err
	}
	if m.StateVersion < 0 {
		return fmt.Errorf("manifest state_version %d is negative", m.StateVersion)
	}
	if len(m.MigratesFrom) > MaxMigratesFrom {
		return fmt.Errorf("manifest migrates_from lists %d versions; the limit is %d", len(m.MigratesFrom), MaxMigratesFrom)
	}
	seen := map[int]bool{}
	for _, v := range m.MigratesFrom {
		switch {
		case v < 0:
			return fmt.Errorf("manifest migrates_from lists %d, a negative version", v)
		case v == m.StateVersion:
			return fmt.Errorf("manifest migrates_from lists %d, its own state_version", v)
		case seen[v]:
			return fmt.Errorf("manifest migrates_from lists %d twice", v)
		}
		seen[v] = true
	}
	return nil
}

// Migrates reports whether the module may restore state written at version from: its own
// version, or one it migrates from.
func (m Manifest) Migrates(from int) bool {
	if from == m.StateVersion {
		return true
	}
	for _, v := range m.MigratesFrom {
		if v == from {
			return true
		}
	}
	return false
}

func (m Manifest) stateIndex(name string) int {
	for i, s := range m.States {
		if s == name {
			return i
		}
	}
	return -1
}

// PrefetchIDs returns the state indices of the prefetched states, in prefetch order.
func (m Manifest) PrefetchIDs() []uint32 {
	ids := make([]uint32, len(m.Prefetch))
	for i, p := range m.Prefetch {
		ids[i] = uint32(m.stateIndex(p))
	}
	return ids
}

func checkNames(what string, names []string, max int) error {
	if len(names) > max {
		return fmt.Errorf("manifest declares %d %s; the limit is %d", len(names), what, max)
	}
	seen := make(map[string]bool, len(names))
	for _, n := range names {
		if !stateNameRE.MatchString(n) {
			return fmt.Errorf("manifest %s name %q is invalid: use 1-128 characters of [A-Za-z0-9_.-]", what, n)
		}
		if seen[n] {
			return fmt.Errorf("manifest declares %s name %q twice", what, n)
		}
		seen[n] = true
	}
	return nil
}
