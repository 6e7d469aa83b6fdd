package kafka

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// markerValue is the value of a marker record: which epoch of which sink subtask the
// transaction carrying it completes, and the manifest that epoch commits.
type markerValue struct {
	Version  int    `json:"v"`
	Job      string `json:"job"`
	Sink     string `json:"sink"`
	Subtask  int    `json:"subtask"`
	Epoch    uint64 `json:"epoch"`
	Manifest string `json:"manifest,omitempty"`
}

func encodeMarker(m markerValue) ([]byte, error) {
	m.Version = 1
	return json.Marshal(m)
}

func decodeMarker(b []byte) (markerValue, error) {
	var m markerValue
	if err := json.Unmarshal(b, &m); err != nil {
		return m, err
	}
	if m.Version != 1 {
		return m, fmt.Errorf("marker version %d, want 1", m.Version)
	}
	return m, nil
}

// lastMarker returns the last committed marker of id's subtask on its marker partition, or
// ok false if there is none.
//
// It reads with read_committed, up to the partition's last stable offset. The partition has
// one writer at a time (the subtask's two slots, strictly alternating: the marker of epoch
// n+1 is written only after epoch n's transaction committed), so the only transaction that
// can be open on it is the subtask's latest one, and every committed marker lies below the
// LSO. It keeps control records so that it knows when it has read up to the LSO even when
// the last transactions there were aborted.
func lastMarker(ctx context.Context, admin *kgo.Client, c Config, topic string, id Identity) (markerValue, bool, error) {
	part := int32(id.Subtask)
	adm := kadm.NewClient(admin)
	lctx, cancel := context.WithTimeout(ctx, c.requestTimeout())
	defer cancel()
	starts, err := adm.ListStartOffsets(lctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return markerValue{}, false, brokersErr(c, classify("list marker offsets", err))
	}
	lsos, err := adm.ListCommittedOffsets(lctx, topic)
	if err == nil {
		err = lsos.Error()
	}
	if err != nil {
		return markerValue{}, false, brokersErr(c, classify("list marker offsets", err))
	}
	so, ok1 := starts.Lookup(topic, part)
	lo, ok2 := lsos.Lookup(topic, part)
	if !ok1 || !ok2 {
		// The subtask's partition does not exist: it never wrote a marker.
		return markerValue{}, false, nil
	}
	start, lso := so.Offset, lo.Offset
	for window := int64(64); lso > start; window *= 4 {
		from := max(start, lso-window)
		m, found, err := scanMarkers(ctx, c, topic, part, from, lso, id)
		if err != nil || found {
			return m, found, err
		}
		lso = from
	}
	return markerValue{}, false, nil
}

// scanMarkers reads [from, to) of the marker partition and returns the last marker of id.
func scanMarkers(ctx context.Context, c Config, topic string, part int32, from, to int64, id Identity) (markerValue, bool, error) {
	cl, err := c.newClient(
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {part: kgo.NewOffset().At(from)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
	)
	if err != nil {
		return markerValue{}, false, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, c.requestTimeout())
	defer cancel()
	var (
		last  markerValue
		found bool
	)
	key := id.TransactionalID(0)
	for next := from; next < to; {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return last, found, &Error{Op: "read markers", Kind: ErrUnreachable, Retryable: true,
				Err: fmt.Errorf("%s/%d: read up to %d of [%d, %d): %w", topic, part, next, from, to, err)}
		}
		if err := fs.Err(); err != nil {
			return last, found, brokersErr(c, classify("read markers", err))
		}
		for r := range fs.RecordsAll() {
			if r.Offset >= to {
				break
			}
			next = r.Offset + 1
			if r.Attrs.IsControl() || string(r.Key) != key {
				continue
			}
			m, err := decodeMarker(r.Value)
			if err != nil {
				return last, found, &Error{Op: "read markers", Kind: ErrInvariant,
					Err: fmt.Errorf("%s/%d@%d: %w", topic, part, r.Offset, err)}
			}
			if m.Job != id.Job || m.Sink != id.Sink || m.Subtask != id.Subtask {
				return last, found, &Error{Op: "read markers", Kind: ErrInvariant,
					Err: fmt.Errorf("%s/%d@%d is a marker of %s/%s/%d: the marker topic is shared", topic, part, r.Offset, m.Job, m.Sink, m.Subtask)}
			}
			last, found = m, true
		}
	}
	return last, found, nil
}
