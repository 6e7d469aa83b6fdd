package pipeline

import (
	"bytes"
	"encoding/base64"
	"encoding/csv"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/clink-wasm/clink-wasm/host/scheduler"
)

// deadLetters decodes the dead-letter output, one record a line, with the raw record restored
// from raw or raw_base64.
type deadRec struct {
	Line   int64  `json:"line"`
	Reason string `json:"reason"`
	Raw    []byte `json:"-"`
}

func deadLetters(t testing.TB, out []byte) []deadRec {
	t.Helper()
	var recs []deadRec
	for l := range bytes.Lines(out) {
		var r struct {
			Line      *int64  `json:"line"`
			Reason    string  `json:"reason"`
			Raw       *string `json:"raw"`
			RawBase64 *string `json:"raw_base64"`
		}
		if err := json.Unmarshal(l, &r); err != nil {
			t.Fatalf("dead letter %q: %v", l, err)
		}
		if r.Line == nil || r.Reason == "" || (r.Raw == nil) == (r.RawBase64 == nil) {
			t.Fatalf("dead letter %q lacks line, reason, or exactly one of raw and raw_base64", l)
		}
		d := deadRec{Line: *r.Line, Reason: r.Reason}
		if r.Raw != nil {
			d.Raw = []byte(*r.Raw)
		} else {
			b, err := base64.StdEncoding.DecodeString(*r.RawBase64)
			if err != nil {
				t.Fatalf("dead letter %q: raw_base64: %v", l, err)
			}
			d.Raw = b
		}
		recs = append(recs, d)
	}
	return recs
}

func recordValues(els []scheduler.Element) []string {
	var out []string
	for _, e := range els {
		if e.Kind == scheduler.ElementRecord {
			out = append(out, string(e.Value))
		}
	}
	return out
}

// TestSourceCSVMalformed: rows encoding/csv cannot parse are malformed records (dead letters with
// their line and raw text under skip, an error naming the line under fail); they never panic.
// An empty file is zero records.
func TestSourceCSVMalformed(t *testing.T) {
	for _, tc := range []struct {
		name, in   string
		want       []string // records
		dead       []deadRec
		failLine   string // the error under MalformedFail, "" if none
		headerFail bool
	}{
		{name: "empty file", in: ""},
		{name: "header only", in: "user,n\n"},
		{name: "bare quote", in: "user,n\na\"b,1\nann,2\n", want: []string{`{"user":"ann","n":2}`},
			dead: []deadRec{{Line: 2, Raw: []byte(`a"b,1`)}}, failLine: "input line 2: bare \" in non-quoted-field"},
		{name: "unterminated quote", in: "user,n\nann,1\n\"bob,2\nann,3\n", want: []string{`{"user":"ann","n":1}`},
			dead: []deadRec{{Line: 3, Raw: []byte("\"bob,2\nann,3")}}, failLine: "input line 3: extraneous or missing \" in quoted-field"},
		{name: "unterminated quote at EOF", in: "user,n\n\"x", dead: []deadRec{{Line: 2, Raw: []byte(`"x`)}},
			failLine: "input line 2:"},
		{name: "wrong field count", in: "user,n\r\n\r\nann,1,extra\r\nbob,2\r\n", want: []string{`{"user":"bob","n":2}`},
			dead: []deadRec{{Line: 3, Raw: []byte("ann,1,extra")}}, failLine: "input line 3: wrong number of fields"},
		{name: "multi-line row", in: "user,note\nann,\"two\nlines\"\nbob,x\"y\n", want: []string{`{"user":"ann","note":"two\nlines"}`},
			dead: []deadRec{{Line: 4, Raw: []byte(`bob,x"y`)}}, failLine: "input line 4:"},
		{name: "bad header", in: "us\"er,n\nann,1\n", headerFail: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			els, dl, err := runSource(t, sourceConfig{format: FormatCSV, policy: MalformedSkip}, tc.in)
			if tc.headerFail {
				if err == nil || !strings.Contains(err.Error(), "CSV header") {
					t.Fatalf("bad header under skip: %v", err)
				}
				var me *MalformedError
				if errors.As(err, &me) {
					t.Fatalf("a bad header is not a skippable record: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := recordValues(els); strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("records %q, want %q", got, tc.want)
			}
			dead := deadLetters(t, dl.Bytes())
			if len(dead) != len(tc.dead) {
				t.Fatalf("dead letters %+v, want %d", dead, len(tc.dead))
			}
			for i, d := range tc.dead {
				if dead[i].Line != d.Line || !bytes.Equal(dead[i].Raw, d.Raw) {
					t.Errorf("dead letter %d: line %d raw %q, want line %d raw %q", i, dead[i].Line, dead[i].Raw, d.Line, d.Raw)
				}
			}
			_, _, err = runSource(t, sourceConfig{format: FormatCSV}, tc.in)
			if tc.failLine == "" {
				if err != nil {
					t.Fatalf("fail policy: %v", err)
				}
				return
			}
			var me *MalformedError
			if err == nil || !strings.Contains(err.Error(), tc.failLine) || !errors.As(err, &me) {
				t.Fatalf("fail policy: %v, want %q", err, tc.failLine)
			}
		})
	}
}

// TestSourceCSVRecordLimit: a CSV row over the record limit is a malformed record kept whole;
// one so long that encoding/csv would have to hold it all (over the limit plus 64 KiB) fails
// the run, naming its line, instead of growing without bound.
func TestSourceCSVRecordLimit(t *testing.T) {
	big := strings.Repeat("x", 2000) // over runSource's 1 KiB limit
	_, dl, err := runSource(t, sourceConfig{format: FormatCSV, policy: MalformedSkip}, "u,v\na,1\nb,"+big+"\nc,3\n")
	dead := deadLetters(t, dl.Bytes())
	if err != nil || len(dead) != 1 || dead[0].Line != 3 || string(dead[0].Raw) != "b,"+big || !strings.Contains(dead[0].Reason, "exceeds the 1024-byte limit") {
		t.Fatalf("%v %+v", err, dead)
	}
	huge := strings.Repeat("y", 200<<10)
	els, _, err := runSource(t, sourceConfig{format: FormatCSV, policy: MalformedSkip}, "u,v\na,1\nb,\""+huge+"\"\nc,3\n")
	if err == nil || !strings.Contains(err.Error(), "input line 3: a CSV record exceeds the 1024-byte record limit") || len(recordValues(els)) != 1 {
		t.Fatalf("huge row: %v, %d records", err, len(recordValues(els)))
	}
}

// TestSourceCSVRawRow: a row that parses but cannot be keyed goes to the dead letters as the
// row's raw text, not as its JSON conversion (nor as "").
func TestSourceCSVRawRow(t *testing.T) {
	in := "user,n\n\"a, \"\"quoted\"\" one\",1\n\"\",2\n"
	_, dl, err := runSource(t, sourceConfig{format: FormatCSV, keyField: "nope", policy: MalformedSkip}, in)
	if err != nil {
		t.Fatal(err)
	}
	dead := deadLetters(t, dl.Bytes())
	if len(dead) != 2 || string(dead[0].Raw) != `"a, ""quoted"" one",1` || string(dead[1].Raw) != `"",2` ||
		dead[0].Line != 2 || dead[1].Line != 3 || !strings.Contains(dead[0].Reason, `no "nope" field`) {
		t.Fatalf("dead letters %+v", dead)
	}
}

// TestSourceBOM: a UTF-8 byte order mark at the start of the input is not part of the first
// record (JSON Lines) or of the first header name (CSV). One elsewhere is data.
func TestSourceBOM(t *testing.T) {
	bom := "\xef\xbb\xbf"
	els, _, err := runSource(t, sourceConfig{keyField: "k"}, bom+`{"k":"a"}`+"\n")
	if err != nil || len(recordValues(els)) != 1 || string(els[0].Key) != "a" {
		t.Fatalf("JSON Lines with a BOM: %v %v", recordValues(els), err)
	}
	els, _, err = runSource(t, sourceConfig{format: FormatCSV, keyField: "k"}, bom+"k,n\na,1\n")
	if err != nil || len(recordValues(els)) != 1 || string(els[0].Key) != "a" || recordValues(els)[0] != `{"k":"a","n":1}` {
		t.Fatalf("CSV with a BOM: %q %v", recordValues(els), err)
	}
	// Short inputs that start like a BOM but are not one are kept whole.
	for _, in := range []string{"\xef", "\xef\xbb", "{}"} {
		b, err := io.ReadAll(&bomSkipper{r: strings.NewReader(in)})
		if err != nil || string(b) != in {
			t.Errorf("%q read as %q, %v", in, b, err)
		}
	}
	_, _, err = runSource(t, sourceConfig{keyField: "k"}, `{"k":"a"}`+"\n"+bom+`{"k":"b"}`+"\n")
	if err == nil || !strings.Contains(err.Error(), "input line 2") {
		t.Fatalf("a BOM inside the file was accepted: %v", err)
	}
}

// TestDeadLetterLossless: dead letters keep the raw record byte for byte: text as raw, other
// bytes as raw_base64, and lines over the record limit whole (streamed, not cut at 256 bytes).
func TestDeadLetterLossless(t *testing.T) {
	notUTF8 := "{\"k\":\"\xff\xfe\"" // not valid JSON, and not UTF-8
	// Longer than the source's 256 KiB read buffer: the source streams them to the dead letters.
	long := `{"k":"` + strings.Repeat("é", 200<<10) + `"}`
	longCRLF := `{"k":"` + strings.Repeat("x\r", 150<<10) + `"}`
	in := `{"k":"a"}` + "\n" + notUTF8 + "\n" + long + "\n" + `[1]` + "\r\n" + longCRLF + "\r\n" + long + `{"k":"b"}`
	els, dl, err := runSource(t, sourceConfig{keyField: "k", policy: MalformedSkip}, in)
	if err != nil {
		t.Fatal(err)
	}
	if got := recordValues(els); len(got) != 1 {
		t.Fatalf("records %q", got)
	}
	dead := deadLetters(t, dl.Bytes())
	want := []deadRec{{Line: 2, Raw: []byte(notUTF8)}, {Line: 3, Raw: []byte(long)}, {Line: 4, Raw: []byte("[1]")},
		{Line: 5, Raw: []byte(longCRLF)}, {Line: 6, Raw: []byte(long + `{"k":"b"}`)}}
	if len(dead) != len(want) {
		t.Fatalf("%d dead letters, want %d: %s", len(dead), len(want), dl)
	}
	for i, w := range want {
		if dead[i].Line != w.Line || !bytes.Equal(dead[i].Raw, w.Raw) {
			t.Errorf("dead letter %d: line %d, %d raw bytes %.40q; want line %d, %d bytes %.40q", i, dead[i].Line, len(dead[i].Raw), dead[i].Raw, w.Line, len(w.Raw), w.Raw)
		}
	}
	if !strings.Contains(dead[1].Reason, "record limit") {
		t.Errorf("reason %q", dead[1].Reason)
	}
	if !strings.Contains(dl.String(), `"raw":"[1]"`) {
		t.Errorf("text raw not kept as text: %s", dl)
	}
	// Over the record limit but within the read buffer: refused by the record check, kept whole.
	medium := `{"k":"` + strings.Repeat("é", 3000) + `"}`
	_, dl, err = runSource(t, sourceConfig{keyField: "k", policy: MalformedSkip}, medium+"\n")
	if dead := deadLetters(t, dl.Bytes()); err != nil || len(dead) != 1 || string(dead[0].Raw) != medium || !strings.Contains(dead[0].Reason, "exceeds") {
		t.Fatalf("medium line: %v %+v", err, dead)
	}
}

// diskFullWriter fails every write.
type diskFullWriter struct{}

func (diskFullWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestDeadLetterWriteFails(t *testing.T) {
	for _, in := range []string{"[1]\n", `{"k":"` + strings.Repeat("x", 4000) + "\"}\n"} {
		_, _, err := runSource(t, sourceConfig{keyField: "k", policy: MalformedSkip, deadLetter: diskFullWriter{}}, in)
		if err == nil || !strings.Contains(err.Error(), "dead-letter output: disk full") {
			t.Errorf("%.10q: %v", in, err)
		}
	}
}

// FuzzSourceCSV runs the CSV source against encoding/csv itself: on any input it never panics;
// every row the standard reader returns becomes either a record whose fields are the row's
// cells, in order, or a dead letter at the row's start line whose raw text the standard reader
// parses back to the same row. Rows are never lost, duplicated or reordered.
func FuzzSourceCSV(f *testing.F) {
	for _, s := range []string{"", "a,b\n1,2\n", "a\n\"x", "a,b\n\"x\"y,1\n2,3\n", "a,b\n1\n\n3,4\r\n", "\xef\xbb\xbfa\n1\n",
		"a,b\n\"multi\nline\",\"q\"\"q\"\n", "a,a\n1,2\n", "a\n\xff\n", "a\n\"\"\"\n", "\r\n\n\na\n1"} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, in []byte, deadAll bool) {
		cfg := sourceConfig{format: FormatCSV, policy: MalformedSkip, maxKey: 1 << 20, maxValue: 1 << 20}
		if deadAll {
			cfg.keyField = "\x00never" // every parsed row fails keying: its raw text is in the dead letters
		}
		els, dl, err := runSource(t, cfg, string(in))

		// The reference: encoding/csv over the input without its BOM, going on after errors.
		ref := csv.NewReader(bytes.NewReader(bytes.TrimPrefix(in, utf8BOM)))
		type row struct {
			cells []string
			line  int
			err   bool
		}
		var rows []row
		var header []string
		for {
			cells, rerr := ref.Read()
			if rerr == io.EOF {
				break
			}
			var pe *csv.ParseError
			if rerr != nil && !errors.As(rerr, &pe) {
				t.Fatalf("reference reader: %v", rerr)
			}
			if header == nil {
				if rerr != nil {
					if err == nil || !strings.Contains(err.Error(), "CSV header") {
						t.Fatalf("bad header accepted: %v", err)
					}
					return
				}
				header = cells
				continue
			}
			if rerr != nil {
				rows = append(rows, row{line: pe.StartLine, err: true})
				continue
			}
			l, _ := ref.FieldPos(0)
			rows = append(rows, row{cells: cells, line: l})
		}
		if err != nil {
			t.Fatalf("source failed: %v", err)
		}
		recs := recordValues(els)
		dead := deadLetters(t, dl.Bytes())
		if len(recs)+len(dead) != len(rows) {
			t.Fatalf("%d records + %d dead letters, reference has %d rows", len(recs), len(dead), len(rows))
		}
		ri, di := 0, 0
		for _, r := range rows {
			if r.err || deadAll {
				if di >= len(dead) || dead[di].Line != int64(r.line) {
					t.Fatalf("row at line %d (err %v): dead letters %+v", r.line, r.err, dead)
				}
				if !bytes.Contains(in, dead[di].Raw) {
					t.Fatalf("line %d: raw %q is not in the input", r.line, dead[di].Raw)
				}
				if !r.err {
					// The raw text is the row without its terminator ("\n", "\r\n", or none at
					// the end of the input): with the right one it parses back to the same row.
					ok := false
					for _, eol := range []string{"", "\n", "\r\n"} {
						back, perr := csv.NewReader(strings.NewReader(string(dead[di].Raw) + eol)).Read()
						ok = ok || (perr == nil && strings.Join(back, "\x00") == strings.Join(r.cells, "\x00"))
					}
					if !ok {
						t.Fatalf("line %d: raw %q does not parse back to %q", r.line, dead[di].Raw, r.cells)
					}
				}
				di++
				continue
			}
			if ri >= len(recs) {
				t.Fatalf("row at line %d missing", r.line)
			}
			checkCSVRecord(t, recs[ri], header, r.cells)
			ri++
		}
	})
}

// checkCSVRecord checks a CSV record's JSON: the header names in order, each with its cell as a
// number (when it is a JSON number) or a string.
func checkCSVRecord(t *testing.T, rec string, header, cells []string) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(rec))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("record %q: %v", rec, err)
	}
	valid := func(s string) string { return string([]rune(s)) } // JSON strings hold U+FFFD for bad bytes
	for i, h := range header {
		k, err := dec.Token()
		if err != nil || k != valid(h) {
			t.Fatalf("record %q: field %d is %q (%v), want %q", rec, i, k, err, h)
		}
		v, err := dec.Token()
		if err != nil {
			t.Fatalf("record %q: %v", rec, err)
		}
		switch v := v.(type) {
		case json.Number:
			if string(v) != cells[i] || !isJSONNumber(cells[i]) {
				t.Fatalf("record %q: number %s from cell %q", rec, v, cells[i])
			}
		case string:
			if v != valid(cells[i]) || isJSONNumber(cells[i]) {
				t.Fatalf("record %q: string %q from cell %q", rec, v, cells[i])
			}
		default:
			t.Fatalf("record %q: value %v", rec, v)
		}
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		t.Fatalf("record %q: more fields than the header", rec)
	}
}

// FuzzIsJSONNumber checks isJSONNumber against encoding/json: s is a number exactly when it is a
// valid JSON document that decodes to a number and has no surrounding space.
func FuzzIsJSONNumber(f *testing.F) {
	for _, s := range []string{"0", "-0", "01", "1.", "1.5e+3", "+1", "-", " 1", "1 ", `"1"`, "1e", ".5", "1E-0", "Infinity", "0x10"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var v any
		d := json.NewDecoder(strings.NewReader(s))
		d.UseNumber()
		_, isNum := v.(json.Number)
		if d.Decode(&v) == nil {
			_, isNum = v.(json.Number)
			_, err := d.Token()
			isNum = isNum && err == io.EOF && strings.TrimSpace(s) == s
		}
		if got := isJSONNumber(s); got != isNum {
			t.Fatalf("isJSONNumber(%q) = %v, encoding/json says %v", s, got, isNum)
		}
	})
}
