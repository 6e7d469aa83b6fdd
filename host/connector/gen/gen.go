// Package gen is a deterministic, rate-limited generator source for benchmarks, demos and
// tests. Record n of split i is a pure function of (seed, i, n), so a restored run regenerates
// exactly the records an uninterrupted run would have produced after the checkpoint's
// position (the sequence number).
//
// Kinds:
//   - counter: {"key":"k<r mod keys>","seq":n,"ts":T} with r random per record;
//   - nexmark: Nexmark-like people, auctions and bids in Nexmark's 1:3:46 proportions:
//     {"kind":"person","id":..,"name":..,"city":..,"ts":T},
//     {"kind":"auction","id":..,"seller":..,"category":..,"reserve":..,"ts":T},
//     {"kind":"bid","auction":..,"bidder":..,"price":..,"ts":T}.
//
// Event time T is start_ms + n * interval_ms: deterministic, in order per split.
package gen

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// Register adds the generator source ("generator") to c.
func Register(c *pipeline.Connectors) { c.RegisterSource("generator", New) }

// Source is a configured generator.
type Source struct {
	kind     string
	seed     uint64
	splits   int
	count    int64 // per split; 0 = unbounded
	rate     float64
	keys     int64
	startMS  int64
	interval int64
}

// New builds a generator from its options: kind (counter or nexmark), seed, splits, count (per
// split; 0 is unbounded), rate (records per second per split; 0 is unlimited), keys (counter),
// start_ms and interval_ms (event time).
func New(spec *pipeline.SourceSpec, o *pipeline.ConnectorOptions, env *pipeline.Env) (pipeline.Source, error) {
	s := &Source{
		kind:     o.String("kind", "counter"),
		seed:     uint64(o.Int("seed", 1)),
		splits:   int(o.Int("splits", 1)),
		count:    o.Int("count", 0),
		rate:     o.Float("rate", 0),
		keys:     o.Int("keys", 1000),
		startMS:  o.Int("start_ms", 1_700_000_000_000),
		interval: o.Int("interval_ms", 1),
	}
	if s.kind != "counter" && s.kind != "nexmark" {
		o.Fail("kind", "%q is not one of counter, nexmark", s.kind)
	}
	if s.splits < 1 || s.splits > 4096 {
		o.Fail("splits", "must be in [1, 4096]")
	}
	if s.count < 0 {
		o.Fail("count", "must not be negative")
	}
	if s.rate < 0 {
		o.Fail("rate", "must not be negative")
	}
	if s.keys < 1 {
		o.Fail("keys", "must be at least 1")
	}
	if s.interval < 0 {
		o.Fail("interval_ms", "must not be negative")
	}
	return s, nil
}

// Splits implements pipeline.Source.
func (s *Source) Splits(ctx context.Context) ([]string, error) {
	ids := make([]string, s.splits)
	for i := range ids {
		ids[i] = "gen-" + strconv.Itoa(i)
	}
	return ids, nil
}

// Bounded implements pipeline.Source.
func (s *Source) Bounded() bool { return s.count > 0 }

// Open implements pipeline.Source.
func (s *Source) Open(ctx context.Context, splits []pipeline.Split) (pipeline.SourceReader, error) {
	r := &reader{s: s, start: time.Now()}
	for _, sp := range splits {
		var idx int
		if _, err := fmt.Sscanf(sp.ID, "gen-%d", &idx); err != nil || idx < 0 || idx >= s.splits {
			return nil, fmt.Errorf("split %q is not one of this generator's", sp.ID)
		}
		var next int64
		if sp.Position != nil {
			if err := json.Unmarshal(sp.Position, &next); err != nil || next < 0 {
				return nil, fmt.Errorf("split %s: bad position %q", sp.ID, sp.Position)
			}
		}
		r.splits = append(r.splits, split{id: sp.ID, idx: uint64(idx), next: next, from: next})
	}
	return r, nil
}

type split struct {
	id   string
	idx  uint64
	next int64 // sequence number of the next record
	from int64 // where this run started (for the rate)
}

type reader struct {
	s      *Source
	splits []split
	rr     int
	start  time.Time
	buf    []byte
}

func (r *reader) Positions() []pipeline.Split {
	out := make([]pipeline.Split, len(r.splits))
	for i, sp := range r.splits {
		out[i] = pipeline.Split{ID: sp.id, Position: []byte(strconv.FormatInt(sp.next, 10))}
	}
	return out
}

func (r *reader) Close() error { return nil }

func (r *reader) Read(ctx context.Context, buf []pipeline.SourceRecord) (int, error) {
	r.buf = r.buf[:0]
	n := 0
	live := 0
	var wait time.Duration
	elapsed := time.Since(r.start).Seconds()
	for range len(r.splits) {
		i := r.rr % len(r.splits)
		r.rr++
		sp := &r.splits[i]
		if r.s.count > 0 && sp.next >= r.s.count {
			continue
		}
		live++
		allowed := len(buf) - n
		if r.s.rate > 0 {
			due := int64(elapsed*r.s.rate) + 1 - (sp.next - sp.from)
			if due <= 0 {
				w := time.Duration(float64(sp.next-sp.from)/r.s.rate*float64(time.Second)) - time.Since(r.start)
				if wait == 0 || w < wait {
					wait = w
				}
				continue
			}
			allowed = min(allowed, int(min(due, int64(len(buf)))))
		}
		if r.s.count > 0 {
			allowed = min(allowed, int(r.s.count-sp.next))
		}
		for range allowed {
			from := len(r.buf)
			r.buf = r.s.record(r.buf, sp.idx, sp.next)
			buf[n] = pipeline.SourceRecord{Split: i, Value: r.buf[from:len(r.buf):len(r.buf)], Pos: sp.next,
				TS: r.s.startMS + sp.next*r.s.interval, HasTS: true}
			sp.next++
			n++
		}
		if n == len(buf) {
			break
		}
	}
	if live == 0 {
		return 0, io.EOF
	}
	if n == 0 && wait > 0 {
		t := time.NewTimer(min(wait, 20*time.Millisecond))
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
	// Records were appended to one buffer, which may have moved: re-slice.
	off := 0
	for i := range n {
		l := len(buf[i].Value)
		buf[i].Value = r.buf[off : off+l : off+l]
		off += l
	}
	return n, nil
}

// mix is splitmix64.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

var cities = []string{"Portland", "Berlin", "Lisbon", "Osaka", "Nairobi", "Lima", "Oslo", "Pune"}

// record appends record n of split idx.
func (s *Source) record(b []byte, idx uint64, n int64) []byte {
	r := mix(s.seed ^ mix(idx<<40^uint64(n)))
	ts := s.startMS + n*s.interval
	switch s.kind {
	case "nexmark":
		// Global ids stay unique across splits: id = n*splits + idx.
		id := uint64(n)*uint64(s.splits) + idx
		switch m := n % 50; {
		case m == 0:
			b = append(b, `{"kind":"person","id":`...)
			b = strconv.AppendUint(b, id, 10)
			b = append(b, `,"name":"p`...)
			b = strconv.AppendUint(b, r%100000, 10)
			b = append(b, `","city":"`...)
			b = append(b, cities[r%uint64(len(cities))]...)
			b = append(b, '"')
		case m <= 3:
			b = append(b, `{"kind":"auction","id":`...)
			b = strconv.AppendUint(b, id, 10)
			b = append(b, `,"seller":`...)
			b = strconv.AppendUint(b, (r>>8)%max(1, uint64(n/50+1))*50*uint64(s.splits)+idx, 10)
			b = append(b, `,"category":`...)
			b = strconv.AppendUint(b, 10+r%5, 10)
			b = append(b, `,"reserve":`...)
			b = strconv.AppendUint(b, 100+(r>>16)%10000, 10)
		default:
			b = append(b, `{"kind":"bid","auction":`...)
			b = strconv.AppendUint(b, (r%max(1, uint64(n/50+1)))*50+1, 10)
			b = append(b, `,"bidder":`...)
			b = strconv.AppendUint(b, (r>>20)%max(1, uint64(n/50+1))*50, 10)
			b = append(b, `,"price":`...)
			b = strconv.AppendUint(b, 1+(r>>32)%100000, 10)
		}
	default:
		b = append(b, `{"key":"k`...)
		b = strconv.AppendUint(b, r%uint64(s.keys), 10)
		b = append(b, `","seq":`...)
		b = strconv.AppendInt(b, n, 10)
	}
	b = append(b, `,"ts":`...)
	b = strconv.AppendInt(b, ts, 10)
	return append(b, '}')
}
