package kafka

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// CLINK_KAFKA_TRACE=1 records, for every test cluster, franz-go's debug log of every client
// and the producer ID, epoch and sequence of every produced batch as the cluster saw them,
// and prints the record when the test fails. CLINK_KAFKA_TRACE=kfake records the cluster's
// side only; CLINK_KAFKA_TRACE=info records the clients' log at info level only (the
// cheapest). Off by default: debug logging slows the clients enough to change the timings
// the tests explore.
var (
	traceOn      = os.Getenv("CLINK_KAFKA_TRACE") != ""
	traceClients = traceOn && os.Getenv("CLINK_KAFKA_TRACE") != "kfake"
	traceCluster = traceOn && os.Getenv("CLINK_KAFKA_TRACE") != "info"
	traceLevel   = map[bool]kgo.LogLevel{true: kgo.LogLevelInfo, false: kgo.LogLevelDebug}[os.Getenv("CLINK_KAFKA_TRACE") == "info"]
)

const traceKeep = 4000 // lines kept (the last ones)

var (
	tracesMu sync.Mutex
	traces   = map[*kfake.Cluster]*traceLog{} // the trace of each live cluster
)

type traceLog struct {
	start time.Time
	mu    sync.Mutex
	lines []string
	n     int
}

func (l *traceLog) add(format string, args ...any) {
	line := fmt.Sprintf("%8.3fms ", float64(time.Since(l.start).Microseconds())/1000) + fmt.Sprintf(format, args...)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n++
	if len(l.lines) == traceKeep {
		copy(l.lines, l.lines[1:])
		l.lines = l.lines[:traceKeep-1]
	}
	l.lines = append(l.lines, line)
}

func (l *traceLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprintf("trace: %d lines, the last %d:\n", l.n, len(l.lines)) + strings.Join(l.lines, "\n")
}

func (l *traceLog) Level() kgo.LogLevel { return traceLevel }

func (l *traceLog) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	l.add("kgo %s %s %v", level, msg, keyvals)
}

// trace attaches a trace to cluster c and to the clients built from cfg (when traceOn),
// and prints it if t fails.
func trace(t testing.TB, c *kfake.Cluster, cfg *Config) {
	if !traceOn {
		return
	}
	l := &traceLog{start: time.Now()}
	if traceClients {
		cfg.logger = l
	}
	if traceCluster {
		for _, key := range []int16{int16(kmsg.Produce), int16(kmsg.InitProducerID), int16(kmsg.EndTxn), int16(kmsg.AddPartitionsToTxn)} {
			c.ControlKey(key, func(req kmsg.Request) (kmsg.Response, error, bool) {
				c.KeepControl()
				switch r := req.(type) {
				case *kmsg.ProduceRequest:
					for _, rt := range r.Topics {
						for _, rp := range rt.Partitions {
							var b kmsg.RecordBatch
							if err := b.ReadFrom(rp.Records); err != nil {
								l.add("kfake produce v%d %s/%d: %v", r.Version, rt.Topic, rp.Partition, err)
								continue
							}
							l.add("kfake produce v%d %s/%d pid %d epoch %d seq %d n %d", r.Version, rt.Topic, rp.Partition, b.ProducerID, b.ProducerEpoch, b.FirstSequence, b.NumRecords)
						}
					}
				case *kmsg.InitProducerIDRequest:
					l.add("kfake init-producer-id v%d txn %v pid %d epoch %d", r.Version, deref(r.TransactionalID), r.ProducerID, r.ProducerEpoch)
				case *kmsg.EndTxnRequest:
					l.add("kfake end-txn v%d txn %s pid %d epoch %d commit %v", r.Version, r.TransactionalID, r.ProducerID, r.ProducerEpoch, r.Commit)
				case *kmsg.AddPartitionsToTxnRequest:
					l.add("kfake add-partitions v%d txn %s pid %d epoch %d", r.Version, r.TransactionalID, r.ProducerID, r.ProducerEpoch)
				}
				return nil, nil, false
			})
		}
	}
	tracesMu.Lock()
	traces[c] = l
	tracesMu.Unlock()
	t.Cleanup(func() {
		tracesMu.Lock()
		delete(traces, c)
		tracesMu.Unlock()
		if t.Failed() {
			t.Log(l)
		}
	})
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// traceOf returns the trace of cluster c (nil without CLINK_KAFKA_TRACE).
func traceOf(c *kfake.Cluster) *traceLog {
	tracesMu.Lock()
	defer tracesMu.Unlock()
	return traces[c]
}
