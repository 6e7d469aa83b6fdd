package abi

import (
	"bytes"
	"encoding/binary"
	"errors"
)

// EmbedManifest returns a copy of bin with the manifest JSON in a `clink.manifest` custom
// section, replacing any existing one. Toolchains that cannot emit custom sections (Go,
// AssemblyScript) can use it after building (`clink-wasm manifest embed`), so that the host
// and `clink-wasm inspect` read the manifest without instantiating the module.
func EmbedManifest(bin []byte, manifest []byte) ([]byte, error) {
	if _, err := ParseManifest(manifest); err != nil {
		return nil, err
	}
	stripped, err := removeCustomSection(bin, ManifestSection)
	if err != nil {
		return nil, err
	}
	return AppendCustomSection(stripped, ManifestSection, manifest), nil
}

// AppendCustomSection appends a custom section to a module binary. Custom sections may appear
// anywhere, so appending never disturbs the module.
func AppendCustomSection(bin []byte, name string, data []byte) []byte {
	var payload []byte
	payload = binary.AppendUvarint(payload, uint64(len(name)))
	payload = append(payload, name...)
	payload = append(payload, data...)
	out := bytes.Clone(bin)
	out = append(out, 0)
	out = binary.AppendUvarint(out, uint64(len(payload)))
	return append(out, payload...)
}

// removeCustomSection drops every custom section named name.
func removeCustomSection(bin []byte, name string) ([]byte, error) {
	if len(bin) < 8 || !bytes.Equal(bin[:4], []byte("\x00asm")) {
		return nil, errors.New("not a WebAssembly module")
	}
	out := bytes.Clone(bin[:8])
	p := bin[8:]
	for len(p) > 0 {
		id := p[0]
		size, n := binary.Uvarint(p[1:])
		if n <= 0 || size > uint64(len(p)-1-n) {
			return nil, errors.New("truncated section")
		}
		end := 1 + n + int(size)
		sec := p[:end]
		keep := true
		if id == 0 {
			body := p[1+n : end]
			nl, m := binary.Uvarint(body)
			if m > 0 && nl <= uint64(len(body)-m) && string(body[m:m+int(nl)]) == name {
				keep = false
			}
		}
		if keep {
			out = append(out, sec...)
		}
		p = p[end:]
	}
	return out, nil
}
