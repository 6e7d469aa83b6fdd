package pipeline

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"slices"
	"sort"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// ParseSpec reads a pipeline spec from YAML or JSON (JSON is YAML), fills in defaults and
// validates it. Every problem is reported with its field path in a *SpecError: unknown fields
// (with a suggestion), wrong types, and the checks of Validate. Connector options are checked
// later, by ValidateConnectors.
func ParseSpec(data []byte) (*Spec, error) {
	if len(data) > MaxSpecBytes {
		return nil, &SpecError{Problems: []*FieldError{{Reason: fmt.Sprintf("the spec is %d bytes; the limit is %d", len(data), MaxSpecBytes)}}}
	}
	var tree any
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&tree); err != nil {
		return nil, &SpecError{Problems: []*FieldError{{Reason: "not valid YAML or JSON: " + strings.TrimPrefix(err.Error(), "yaml: ")}}}
	}
	var extra any
	if err := dec.Decode(&extra); err == nil {
		return nil, &SpecError{Problems: []*FieldError{{Reason: "the file holds more than one document; a spec is one"}}}
	}
	tree, err := normalize(tree, 0)
	if err != nil {
		return nil, &SpecError{Problems: []*FieldError{{Reason: err.Error()}}}
	}
	root, ok := tree.(map[string]any)
	if !ok {
		return nil, &SpecError{Problems: []*FieldError{{Reason: "a spec is a mapping of fields (version, name, sources, operators, sinks)"}}}
	}
	// Connector fields of sources and sinks move into options.
	for _, list := range []struct {
		field string
		t     reflect.Type
	}{{"sources", reflect.TypeFor[SourceSpec]()}, {"sinks", reflect.TypeFor[SinkSpec]()}} {
		items, _ := root[list.field].([]any)
		known := fieldNames(list.t)
		for _, it := range items {
			m, ok := it.(map[string]any)
			if !ok {
				continue
			}
			opts, _ := m["options"].(map[string]any)
			for k, v := range m {
				if !slices.Contains(known, k) {
					if opts == nil {
						opts = map[string]any{}
					}
					opts[k] = v
					delete(m, k)
				}
			}
			if opts != nil {
				m["options"] = opts
			}
		}
	}
	// Key shorthand: key: user means key: {field: user}.
	if ops, ok := root["operators"].([]any); ok {
		for _, it := range ops {
			if m, ok := it.(map[string]any); ok {
				if k, ok := m["key"].(string); ok {
					m["key"] = map[string]any{"field": k}
				}
			}
		}
	}
	var p problems
	checkShape(&p, "", tree, reflect.TypeFor[Spec]())
	if err := p.err(); err != nil {
		return nil, err
	}
	js, err := json.Marshal(tree)
	if err != nil {
		return nil, &SpecError{Problems: []*FieldError{{Reason: err.Error()}}}
	}
	var s Spec
	if err := json.Unmarshal(js, &s); err != nil {
		// checkShape accepted the tree, so this is a value a custom decoder refused.
		return nil, &SpecError{Problems: []*FieldError{{Reason: err.Error()}}}
	}
	canonical(reflect.ValueOf(&s).Elem())
	s.ApplyDefaults()
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

// canonical makes empty lists and mappings nil, so that a spec and its JSON rendering (which
// omits them) decode to the same value.
func canonical(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			canonical(v.Elem())
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				canonical(v.Field(i))
			}
		}
	case reflect.Slice:
		if v.Len() == 0 && !v.IsNil() && v.CanSet() {
			v.SetZero()
			return
		}
		for i := range v.Len() {
			canonical(v.Index(i))
		}
	case reflect.Map:
		if v.Len() == 0 && !v.IsNil() && v.CanSet() {
			v.SetZero()
		}
	}
}

// normalize turns YAML's decoded tree into JSON's: string keys only, bounded depth.
func normalize(v any, depth int) (any, error) {
	if depth > 64 {
		return nil, fmt.Errorf("the spec nests deeper than 64 levels")
	}
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			n, err := normalize(e, depth+1)
			if err != nil {
				return nil, err
			}
			x[k] = n
		}
		return x, nil
	case map[any]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("mapping key %v is not a string", k)
			}
			n, err := normalize(e, depth+1)
			if err != nil {
				return nil, err
			}
			out[ks] = n
		}
		return out, nil
	case []any:
		for i, e := range x {
			n, err := normalize(e, depth+1)
			if err != nil {
				return nil, err
			}
			x[i] = n
		}
		return x, nil
	case float64:
		if math.IsInf(x, 0) || math.IsNaN(x) {
			return nil, fmt.Errorf("%v is not a number JSON can carry", x)
		}
	}
	return v, nil
}

func fieldNames(t reflect.Type) []string {
	var out []string
	for f := range t.Fields() {
		if n := jsonName(f); n != "" {
			out = append(out, n)
		}
	}
	return out
}

func jsonName(f reflect.StructField) string {
	tag := f.Tag.Get("json")
	if tag == "-" || !f.IsExported() {
		return ""
	}
	name, _, _ := strings.Cut(tag, ",")
	if name == "" {
		name = f.Name
	}
	return name
}

var durationType = reflect.TypeFor[Duration]()

// checkShape compares a decoded tree with the Go type it will decode into, reporting unknown
// fields and wrong types at their paths.
func checkShape(p *problems, path string, v any, t reflect.Type) {
	if v == nil {
		return // null: the zero value
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == durationType || t.Name() == "Duration" {
		s, ok := v.(string)
		if !ok {
			p.add(path, "want a duration like \"10s\", not %s", describe(v))
			return
		}
		if _, err := parseDuration(s); err != nil {
			p.add(path, "%v", err)
		}
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			p.add(path, "want a mapping of fields, not %s", describe(v))
			return
		}
		fields := map[string]reflect.StructField{}
		for f := range t.Fields() {
			if n := jsonName(f); n != "" {
				fields[n] = f
			}
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			f, ok := fields[k]
			if !ok {
				msg := "unknown field"
				if s := suggest(k, fields); s != "" {
					msg += fmt.Sprintf(" (did you mean %q?)", s)
				}
				p.add(join(path, k), "%s", msg)
				continue
			}
			checkShape(p, join(path, k), m[k], f.Type)
		}
	case reflect.Slice:
		l, ok := v.([]any)
		if !ok {
			p.add(path, "want a list, not %s", describe(v))
			return
		}
		for i, e := range l {
			checkShape(p, fmt.Sprintf("%s[%d]", path, i), e, t.Elem())
		}
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			p.add(path, "want a mapping, not %s", describe(v))
			return
		}
		for k, e := range m {
			checkShape(p, join(path, k), e, t.Elem())
		}
	case reflect.String:
		if _, ok := v.(string); !ok {
			p.add(path, "want a string, not %s", describe(v))
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			p.add(path, "want true or false, not %s", describe(v))
		}
	case reflect.Int, reflect.Int64, reflect.Int32, reflect.Uint32, reflect.Uint64, reflect.Uint:
		f, ok := number(v)
		if !ok || f != math.Trunc(f) {
			p.add(path, "want a whole number, not %s", describe(v))
			return
		}
		lo, hi := -1e15, 1e15
		if t.Kind() >= reflect.Uint {
			lo = 0
		}
		if t.Kind() == reflect.Int32 || t.Kind() == reflect.Uint32 {
			hi = 1 << 31
		}
		if f < lo || f > hi {
			p.add(path, "%v is out of range", f)
		}
	case reflect.Float64:
		if _, ok := number(v); !ok {
			p.add(path, "want a number, not %s", describe(v))
		}
	case reflect.Interface:
	}
}

func number(v any) (float64, bool) {
	switch x := v.(type) {
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	case uint64:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}

func describe(v any) string {
	switch x := v.(type) {
	case string:
		if len(x) > 40 {
			x = x[:40] + "..."
		}
		return fmt.Sprintf("the string %q", x)
	case bool:
		return fmt.Sprintf("%v", x)
	case []any:
		return "a list"
	case map[string]any:
		return "a mapping"
	}
	if f, ok := number(v); ok {
		return fmt.Sprintf("the number %v", f)
	}
	return fmt.Sprintf("%T", v)
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

// suggest returns the known field closest to k, if it is close.
func suggest(k string, fields map[string]reflect.StructField) string {
	best, bestD := "", 3
	for f := range fields {
		if d := editDistance(k, f); d < bestD || (d == bestD && f < best && best != "") {
			best, bestD = f, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 99
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := 1
			if a[i-1] == b[j-1] {
				c = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+c)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// MarshalSpec renders a spec as indented JSON (what the server stores).
func MarshalSpec(s *Spec) ([]byte, error) { return json.MarshalIndent(s, "", "  ") }
