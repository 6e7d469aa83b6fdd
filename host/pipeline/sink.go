package pipeline

import (
	"encoding/json"
	"errors"
	"fmt"
)

// OutputError reports an emitted value the output format rejects.
type OutputError struct {
	Operator string
	Where    string
	Key      []byte
	Err      error
}

func (e *OutputError) Error() string {
	return fmt.Sprintf("operator %q emitted an invalid value at %s (key %q): %v", e.Operator, e.Where, e.Key, e.Err)
}

func (e *OutputError) Unwrap() error { return e.Err }

func invalidJSON(v []byte) error {
	var x any
	if err := json.Unmarshal(v, &x); err != nil {
		return fmt.Errorf("not valid JSON: %w", err)
	}
	return errors.New("not valid JSON")
}
