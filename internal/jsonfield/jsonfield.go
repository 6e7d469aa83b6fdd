// Package jsonfield reads top-level fields of JSON objects without decoding them: the sources
// run it on every record to find the key and the event time. It agrees with encoding/json
// decoding into a map, the last of duplicate names winning (FuzzTop checks it).
package jsonfield

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Top returns the raw JSON value of the top-level field name of obj, which must be valid
// JSON (the sources check Valid first). Like encoding/json decoding into a map, the last
// of duplicate names wins. It scans bytes instead of decoding: the source runs it on every
// record.
func Top(obj []byte, name string) (json.RawMessage, bool, error) {
	raw, _, ok, err := top(obj, name)
	return raw, ok, err
}

// TopKey is Key of Top's value, in one pass: the key text of the top-level field name of obj
// (which must be valid JSON). false when there is no such field.
func TopKey(obj []byte, name string) ([]byte, bool, error) {
	raw, plain, ok, err := top(obj, name)
	if !ok || err != nil {
		return nil, ok, err
	}
	if plain { // a string of ASCII without escapes: its bytes between the quotes
		return raw[1 : len(raw)-1], true, nil
	}
	k, err := Key(raw)
	return k, true, err
}

// top is Top, also reporting whether the value found is a plain string (ASCII, no escape).
func top(obj []byte, name string) (found json.RawMessage, plainValue, ok bool, err error) {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return nil, false, false, errors.New("not a JSON object")
	}
	i++
	for {
		i = skipSpace(obj, i)
		if i >= len(obj) {
			return nil, false, false, errors.New("truncated JSON object")
		}
		if obj[i] == '}' {
			return found, plainValue, ok, nil
		}
		if obj[i] == ',' {
			i = skipSpace(obj, i+1)
		}
		ks := i
		var plain bool
		i, plain = scanString(obj, i)
		key := obj[ks:i]
		i = skipSpace(obj, i)
		if i >= len(obj) || obj[i] != ':' {
			return nil, false, false, errors.New("malformed JSON object")
		}
		i = skipSpace(obj, i+1)
		vs := i
		// A plain key (ASCII, no escape) decodes to its bytes: compare them, without the
		// decoding check keyIs makes.
		if plain && len(key) >= 2 && string(key[1:len(key)-1]) == name || !plain && keyIs(key, name) {
			pv := false
			if i < len(obj) && obj[i] == '"' {
				i, pv = scanString(obj, i)
			} else {
				i = skipValue(obj, i)
			}
			found, plainValue, ok = obj[vs:i], pv, true
			if !mayHaveField(obj[i:], name) {
				return found, plainValue, ok, nil // no later duplicate can override it
			}
			continue
		}
		i = skipValue(obj, i)
	}
}

// mayHaveField reports whether rest, the part of a valid JSON object after a field, may hold
// another field called name. It may not when rest has no escape (so every name in it is
// written as its bytes) and no quoted occurrence of name: then the field found is the last of
// its name and the scan can stop there (a few vectorised byte searches instead of a scan of
// every later field).
func mayHaveField(rest []byte, name string) bool {
	// Without escapes the one thing decoding changes is invalid UTF-8, into U+FFFD: a name
	// holding U+FFFD may be written otherwise.
	if bytes.IndexByte(rest, '\\') >= 0 || strings.Contains(name, "\uFFFD") {
		return true
	}
	for q := 0; ; {
		j := bytes.IndexByte(rest[q:], '"')
		if j < 0 {
			return false
		}
		q += j + 1
		if end := q + len(name); end < len(rest) && rest[end] == '"' && string(rest[q:end]) == name {
			return true
		}
	}
}

// keyIs reports whether the quoted JSON string key decodes to name.
func keyIs(key []byte, name string) bool {
	if len(key) < 2 {
		return false
	}
	if bytes.IndexByte(key, '\\') < 0 && utf8.Valid(key) {
		return string(key[1:len(key)-1]) == name
	}
	var s string
	return json.Unmarshal(key, &s) == nil && s == name
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// scanString returns the index after the string starting at b[i] (a quote), and whether the
// string is plain: ASCII without escapes, so that it decodes to the bytes between its quotes.
func scanString(b []byte, i int) (int, bool) {
	plain := true
	for i++; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i + 1, plain
		case c == '\\':
			plain = false
			i++
		case c >= 0x80:
			plain = false
		}
	}
	return i, false
}

// skipString returns the index after the string starting at b[i] (a quote).
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return i
}

// skipValue returns the index after the value starting at b[i].
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	for i < len(b) {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}

// Key turns a JSON field value into key bytes: strings unquoted, numbers and booleans
// as written.
func Key(raw json.RawMessage) ([]byte, error) {
	switch {
	case len(raw) == 0:
		return nil, errors.New("empty value")
	case raw[0] == '"' && bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw):
		return raw[1 : len(raw)-1], nil
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		return []byte(s), nil
	case raw[0] == '{' || raw[0] == '[' || raw[0] == 'n':
		return nil, errors.New("a key must be a string, number or boolean")
	}
	return raw, nil
}

// Time reads a time field: epoch milliseconds, or an RFC 3339 string.
func Time(raw json.RawMessage) (int64, error) {
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, err
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return 0, &timeError{err} // errors.As still finds the *time.ParseError
		}
		return t.UnixMilli(), nil
	}
	if ms, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
		return ms, nil
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || f != f || f > 9.2e18 || f < -9.2e18 {
		return 0, errors.New("a time must be epoch milliseconds or an RFC 3339 string")
	}
	return int64(f), nil
}

// timeError is a time string that does not parse, with the one message of Time's errors.
type timeError struct{ err error }

func (e *timeError) Error() string { return "a time must be epoch milliseconds or an RFC 3339 string" }
func (e *timeError) Unwrap() error { return e.err }
