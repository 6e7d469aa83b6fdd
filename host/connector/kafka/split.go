package kafka

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Split is a unit of source parallelism: one partition of one topic.
type Split struct {
	Topic     string
	Partition int32
}

func (s Split) String() string { return s.Topic + "/" + strconv.Itoa(int(s.Partition)) }

func compareSplits(a, b Split) int {
	if c := cmp.Compare(a.Topic, b.Topic); c != 0 {
		return c
	}
	return cmp.Compare(a.Partition, b.Partition)
}

// SortSplits sorts splits by topic then partition, the order in which Assign deals them.
func SortSplits(s []Split) { slices.SortFunc(s, compareSplits) }

// Assign deals splits (sorted) round-robin to parallelism subtasks and returns those of
// subtask i. Every split goes to exactly one subtask, and the same inputs always give the
// same answer, so a restore at the same parallelism reads the same partitions where they
// were read before.
func Assign(splits []Split, subtask, parallelism int) []Split {
	s := slices.Clone(splits)
	SortSplits(s)
	var out []Split
	for i, sp := range s {
		if i%parallelism == subtask {
			out = append(out, sp)
		}
	}
	return out
}

// Positions maps each split to the offset of the next record to read from it. It is the
// source's part of a checkpoint. Its JSON form is {"topic/partition": offset, ...}, sorted,
// so that equal positions encode to equal bytes.
type Positions map[Split]int64

// Clone returns a copy of p.
func (p Positions) Clone() Positions { return maps.Clone(p) }

// MarshalJSON implements json.Marshaler.
func (p Positions) MarshalJSON() ([]byte, error) {
	keys := slices.SortedFunc(maps.Keys(p), compareSplits)
	var b strings.Builder
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		q, _ := json.Marshal(k.String())
		b.Write(q)
		b.WriteByte(':')
		b.WriteString(strconv.FormatInt(p[k], 10))
	}
	b.WriteByte('}')
	return []byte(b.String()), nil
}

// UnmarshalJSON implements json.Unmarshaler.
func (p *Positions) UnmarshalJSON(b []byte) error {
	var m map[string]int64
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	out := make(Positions, len(m))
	for k, v := range m {
		i := strings.LastIndexByte(k, '/')
		if i <= 0 {
			return fmt.Errorf("position key %q is not topic/partition", k)
		}
		part, err := strconv.ParseInt(k[i+1:], 10, 32)
		if err != nil || part < 0 {
			return fmt.Errorf("position key %q is not topic/partition", k)
		}
		if v < 0 {
			return fmt.Errorf("position %q: negative offset %d", k, v)
		}
		out[Split{k[:i], int32(part)}] = v
	}
	*p = out
	return nil
}
