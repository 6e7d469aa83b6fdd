package pipeline

import "github.com/clink-wasm/clink-wasm/internal/jsonfield"

// topLevelField returns the raw JSON of the value of field name in the JSON object obj, which
// must already be valid JSON; false when obj is not an object or has no such field. Like
// encoding/json, the last of duplicate names wins (internal/jsonfield, shared with the Kafka
// source).
func topLevelField(obj []byte, name string) ([]byte, bool) {
	raw, ok, err := jsonfield.Top(obj, name)
	return raw, ok && err == nil
}

// topLevelKey is keyText of topLevelField's value, in one pass: false when obj is not an
// object or has no such field.
func topLevelKey(obj []byte, name string) ([]byte, bool, error) {
	k, ok, err := jsonfield.TopKey(obj, name)
	if !ok {
		return nil, false, nil
	}
	return k, true, err
}

// keyText turns a JSON field value into key bytes: strings unquoted, numbers and booleans as
// written.
func keyText(raw []byte) ([]byte, error) { return jsonfield.Key(raw) }

// parseTime reads an event time: milliseconds since the epoch as a number, or an RFC 3339
// timestamp string.
func parseTime(raw []byte) (int64, error) { return jsonfield.Time(raw) }
