// Command clink-pgo makes a CPU profile of an operator's test binary usable for profile-guided
// optimisation of its Wasm build.
//
// `go test -cpuprofile` names the functions of the package under test by its import path
// (github.com/you/op.process), but the Wasm module is built from the same package as main
// (main.process), and PGO matches call edges by function name: the edges out of the operator's
// own code, which are the hot ones, never match, and only the SDK's internal edges are
// optimised. clink-pgo renames the package's functions to main.* in the profile:
//
//	go test -run '^$' -bench Process -benchtime 10s -cpuprofile cpu.pprof .
//	go run github.com/clink-wasm/clink-wasm/guest-sdk/go/cmd/clink-pgo -o default.pgo cpu.pprof
//
// The package is the one in the current directory (`go list`), or -pkg. The profile is
// otherwise copied unchanged: only its string table is rewritten.
package main

import (
	"bytes"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
)

func main() {
	pkg := flag.String("pkg", "", "import path of the operator's package (default: the package in the current directory)")
	out := flag.String("o", "default.pgo", "output file")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: clink-pgo [-pkg path] [-o default.pgo] cpu.pprof")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*pkg, flag.Arg(0), *out); err != nil {
		fmt.Fprintln(os.Stderr, "clink-pgo:", err)
		os.Exit(1)
	}
}

func run(pkg, in, out string) error {
	if pkg == "" {
		b, err := exec.Command("go", "list", "-f", "{{.ImportPath}}", ".").Output()
		if err != nil {
			return fmt.Errorf("finding the package in the current directory (or pass -pkg): %w", err)
		}
		pkg = strings.TrimSpace(string(b))
	}
	src, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	dst, n, err := renameMain(src, pkg)
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	if n == 0 {
		return fmt.Errorf("%s: no function of package %s in the profile (is it the profile of that package's test?)", in, pkg)
	}
	return os.WriteFile(out, dst, 0o644)
}

// renameMain returns the profile (gzipped profile.proto, as runtime/pprof writes it) with every
// string of the form pkg.X (a function of pkg, its methods and closures) rewritten to main.X,
// and how many it rewrote.
func renameMain(profile []byte, pkg string) ([]byte, int, error) {
	zr, err := gzip.NewReader(bytes.NewReader(profile))
	if err != nil {
		return nil, 0, err
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		return nil, 0, err
	}
	msg, n, err := rewriteStrings(raw, pkg+".", "main.")
	if err != nil {
		return nil, 0, err
	}
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write(msg)
	if err := zw.Close(); err != nil {
		return nil, 0, err
	}
	return b.Bytes(), n, nil
}

// stringTable is the field number of Profile.string_table in profile.proto. Every name in a
// profile is an index into it, so renaming a function is rewriting its string.
const stringTable = 6

var errMalformed = errors.New("not a profile.proto message")

// rewriteStrings copies the top-level fields of the message msg, replacing the prefix from by
// to in the string-table entries that start with it.
func rewriteStrings(msg []byte, from, to string) ([]byte, int, error) {
	out := make([]byte, 0, len(msg))
	n := 0
	for i := 0; i < len(msg); {
		tag, l := uvarint(msg[i:])
		if l <= 0 {
			return nil, 0, errMalformed
		}
		start := i
		i += l
		switch tag & 7 {
		case 0: // varint
			_, l := uvarint(msg[i:])
			if l <= 0 {
				return nil, 0, errMalformed
			}
			i += l
		case 1: // 64-bit
			i += 8
		case 5: // 32-bit
			i += 4
		case 2: // length-delimited
			size, l := uvarint(msg[i:])
			if l <= 0 || size > uint64(len(msg)-i-l) {
				return nil, 0, errMalformed
			}
			body := msg[i+l : i+l+int(size)]
			i += l + int(size)
			if s := string(body); tag>>3 == stringTable && strings.HasPrefix(s, from) {
				s = to + s[len(from):]
				out = appendUvarint(out, tag)
				out = appendUvarint(out, uint64(len(s)))
				out = append(out, s...)
				n++
				continue
			}
		default:
			return nil, 0, errMalformed
		}
		if i > len(msg) {
			return nil, 0, errMalformed
		}
		out = append(out, msg[start:i]...)
	}
	return out, n, nil
}

// uvarint decodes a protobuf varint; l <= 0 if b does not start with one.
func uvarint(b []byte) (v uint64, l int) {
	for i := 0; i < len(b) && i < 10; i++ {
		v |= uint64(b[i]&0x7f) << (7 * i)
		if b[i] < 0x80 {
			return v, i + 1
		}
	}
	return 0, 0
}

func appendUvarint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}
