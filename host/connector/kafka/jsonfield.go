package kafka

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"time"
)

// topField returns the raw JSON value of the top-level field name of the JSON object obj.
// Like encoding/json decoding into a map, the last of duplicate names wins. It walks tokens
// instead of building a map.
func topField(obj []byte, name string) (json.RawMessage, bool, error) {
	dec := json.NewDecoder(bytes.NewReader(obj))
	tok, err := dec.Token()
	if err != nil {
		return nil, false, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, false, errors.New("not a JSON object")
	}
	var (
		found json.RawMessage
		ok    bool
	)
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return nil, false, err
		}
		k, _ := kt.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, false, err
		}
		if k == name {
			found, ok = v, true
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, false, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false, errors.New("data after the JSON object")
	}
	return found, ok, nil
}

// keyBytes turns a JSON field value into key bytes: strings unquoted, numbers and booleans
// as written.
func keyBytes(raw json.RawMessage) ([]byte, error) {
	switch {
	case len(raw) == 0:
		return nil, errors.New("empty value")
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

// eventTime reads a time field: epoch milliseconds, or an RFC 3339 string.
func eventTime(raw json.RawMessage) (int64, error) {
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, err
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return 0, errors.New("a time must be epoch milliseconds or an RFC 3339 string")
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
