package pipeline

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// topLevelField returns the raw JSON of the value of field name in the JSON object obj, which
// must already be valid JSON. It scans instead of decoding the whole object: the source runs it
// on every record.
func topLevelField(obj []byte, name string) ([]byte, bool) {
	i := skipWS(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return nil, false
	}
	i++
	for {
		i = skipWS(obj, i)
		if i >= len(obj) || obj[i] == '}' {
			return nil, false
		}
		if obj[i] == ',' {
			i++
			continue
		}
		kEnd := skipString(obj, i)
		key := obj[i:kEnd]
		i = skipWS(obj, kEnd)
		if i >= len(obj) || obj[i] != ':' {
			return nil, false
		}
		i = skipWS(obj, i+1)
		vEnd := skipValue(obj, i)
		if keyEquals(key, name) {
			return obj[i:vEnd], true
		}
		i = vEnd
	}
}

func keyEquals(quoted []byte, name string) bool {
	if len(quoted) >= 2 && bytes.IndexByte(quoted, '\\') < 0 {
		return string(quoted[1:len(quoted)-1]) == name
	}
	var s string
	return json.Unmarshal(quoted, &s) == nil && s == name
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at b[i] == '"'.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// skipValue returns the index after the JSON value starting at b[i].
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = skipString(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return i
	default:
		for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
			i++
		}
		return i
	}
}

// keyText turns a JSON field value into key bytes: strings unquoted, numbers and booleans as
// written.
func keyText(raw []byte) ([]byte, error) {
	if len(raw) == 0 {
		return nil, errors.New("empty value")
	}
	switch raw[0] {
	case '"':
		if bytes.IndexByte(raw, '\\') < 0 {
			return raw[1 : len(raw)-1], nil
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		return []byte(s), nil
	case '{', '[', 'n':
		return nil, errors.New("a key must be a string, number or boolean")
	}
	return raw, nil
}

// parseTime reads an event time: milliseconds since the epoch as a number, or an RFC 3339
// timestamp string.
func parseTime(raw []byte) (int64, error) {
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, err
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return 0, fmt.Errorf("a time must be epoch milliseconds or an RFC 3339 string: %w", err)
		}
		return t.UnixMilli(), nil
	}
	if ms, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
		return ms, nil
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil {
		return 0, errors.New("a time must be epoch milliseconds or an RFC 3339 string")
	}
	return int64(f), nil
}
