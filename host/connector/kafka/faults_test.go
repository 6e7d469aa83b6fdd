package kafka

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// netFaults sits between the real franz-go clients of one simulated process and the real
// (kfake) cluster, as that process's network. It can kill the process's network (a crash:
// every connection closed, no new one, and the process's context cancelled), take it down
// for a while (a broker that goes away), or act on the next EndTxn request: drop it before
// it is sent, or let it reach the broker and die before the answer comes back (an in-doubt
// commit, which kfake cannot produce by itself since it completes transactions at once).
type netFaults struct {
	cancel context.CancelFunc

	mu struct {
		sync.Mutex
		conns     map[*faultConn]struct{}
		dead      bool
		down      bool
		healAfter int // while down, come back after this many refused dials (0: never)
		refused   int
		onEndTxn  string // "", "drop", "deliver"
		fired     chan struct{}
	}
}

var errNetDead = errors.New("network of this simulated process is down")

// newProcess returns a context for one simulated process and its network.
func newProcess(t testing.TB) (context.Context, *netFaults) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f := &netFaults{cancel: cancel}
	f.mu.conns = map[*faultConn]struct{}{}
	return ctx, f
}

func (f *netFaults) config(c Config) Config {
	c.dial = f.dial
	return c
}

func (f *netFaults) dial(ctx context.Context, network, host string) (net.Conn, error) {
	f.mu.Lock()
	if f.mu.dead || f.mu.down {
		f.mu.refused++
		if f.mu.down && f.mu.healAfter > 0 && f.mu.refused >= f.mu.healAfter {
			f.mu.down = false
		}
		f.mu.Unlock()
		return nil, &net.OpError{Op: "dial", Net: network, Err: errNetDead}
	}
	f.mu.Unlock()
	var d net.Dialer
	c, err := d.DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	fc := &faultConn{Conn: c, f: f}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.mu.dead || f.mu.down {
		c.Close()
		return nil, &net.OpError{Op: "dial", Net: network, Err: errNetDead}
	}
	f.mu.conns[fc] = struct{}{}
	return fc, nil
}

// kill crashes the process: its network dies for good and its context is cancelled.
func (f *netFaults) kill() {
	f.mu.Lock()
	f.mu.dead = true
	f.closeAllLocked()
	f.mu.Unlock()
	f.cancel()
}

// goAway takes the network down; it heals after healAfter refused dials (0: never).
func (f *netFaults) goAway(healAfter int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mu.down, f.mu.healAfter, f.mu.refused = true, healAfter, 0
	f.closeAllLocked()
}

func (f *netFaults) closeAllLocked() {
	for c := range f.mu.conns {
		c.Conn.Close()
	}
	clear(f.mu.conns)
}

// armEndTxn makes the next EndTxn request crash the process, after ("deliver") or before
// ("drop") the request reaches the broker. The returned channel closes when it fired.
func (f *netFaults) armEndTxn(how string) <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mu.onEndTxn, f.mu.fired = how, make(chan struct{})
	return f.mu.fired
}

type faultConn struct {
	net.Conn
	f       *netFaults
	left    int         // bytes of the current request frame not yet seen
	swallow atomic.Bool // the client must never read the answer to what was just sent
}

func (c *faultConn) Read(p []byte) (int, error) {
	if c.swallow.Load() {
		return 0, errNetDead
	}
	return c.Conn.Read(p)
}

// Write sees the request frames franz-go writes (size int32, api key int16, ...).
func (c *faultConn) Write(p []byte) (int, error) {
	if c.left == 0 && len(p) >= 6 {
		size := int(binary.BigEndian.Uint32(p))
		key := int16(binary.BigEndian.Uint16(p[4:]))
		c.left = size + 4
		if key == int16(kmsg.EndTxn) {
			c.f.mu.Lock()
			how, fired := c.f.mu.onEndTxn, c.f.mu.fired
			c.f.mu.onEndTxn = ""
			c.f.mu.Unlock()
			switch how {
			case "drop":
				c.f.kill()
				close(fired)
				return 0, errNetDead
			case "deliver":
				c.swallow.Store(true)
				n, err := c.Conn.Write(p)
				// Give the broker the request before the process dies: wait until it
				// has read it (it answers, and we never read the answer).
				buf := make([]byte, 1)
				c.Conn.SetReadDeadline(time.Now().Add(5 * time.Second))
				c.Conn.Read(buf)
				c.f.kill()
				close(fired)
				if err == nil {
					err = errNetDead
				}
				return n, err
			}
		}
	}
	c.left = max(0, c.left-len(p))
	return c.Conn.Write(p)
}

func (c *faultConn) Close() error {
	c.f.mu.Lock()
	delete(c.f.mu.conns, c)
	c.f.mu.Unlock()
	return c.Conn.Close()
}

// readTopic returns every record of topic, read from the start up to its high watermark,
// with read_committed or read_uncommitted. Control records are left out.
func readTopic(t testing.TB, c Config, topic string, committed bool) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admc, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer admc.Close()
	ends, err := kadm.NewClient(admc).ListEndOffsets(ctx, topic)
	if err != nil || ends.Error() != nil {
		t.Fatalf("end offsets: %v %v", err, ends.Error())
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	opts := []kgo.Opt{kgo.SeedBrokers(c.Brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.KeepControlRecords()}
	if committed {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var out []*kgo.Record
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading %s: still waiting for %v", topic, want)
		}
		for r := range fs.RecordsAll() {
			if r.Offset+1 >= want[r.Partition] {
				delete(want, r.Partition)
			}
			if !r.Attrs.IsControl() {
				out = append(out, r)
			}
		}
	}
	return out
}
