package h2

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/clink-wasm/clink-wasm/host/lookup/internal/attempt"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// batchServer answers on nc after service, with every response of a round in one write:
// the first round waits for rounds[0] requests, the next for rounds[1], and so on.
func batchServer(nc net.Conn, service time.Duration, rounds ...int) {
	defer nc.Close()
	br := bufio.NewReader(nc)
	if _, err := io.ReadFull(br, make([]byte, len(http2.ClientPreface))); err != nil {
		return
	}
	var out, hb bytes.Buffer
	fr := http2.NewFramer(&out, br)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	enc := hpack.NewEncoder(&hb)
	fr.WriteSettings()
	nc.Write(out.Bytes())
	out.Reset()
	var pending []uint32
	for len(rounds) > 0 {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
				nc.Write(out.Bytes())
				out.Reset()
			}
		case *http2.MetaHeadersFrame:
			pending = append(pending, f.StreamID)
		}
		if len(pending) < rounds[0] {
			continue
		}
		time.Sleep(service)
		for _, id := range pending {
			hb.Reset()
			enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true})
			fr.WriteData(id, true, []byte("ok"))
		}
		nc.Write(out.Bytes()) // one write: the client reads the round in one buffer
		out.Reset()
		pending, rounds = pending[:0], rounds[1:]
	}
	io.Copy(io.Discard, br)
}

// TestUpstreamShare: an exchange's upstream share (attempt.Upstream, which the adaptive
// limiter steers by) runs from the write that carried its request to the read that brought
// its response, without the client's own time around them. Two responses arrive in one
// read and the first one's completion takes 5 ms: the second is not charged for it. A
// request started inside that completion waits for the reader's batch to end before it is
// written: it is not charged for that wait either.
func TestUpstreamShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const service = 10 * time.Millisecond
		tr := &Transport{Dial: func(context.Context, string, string) (net.Conn, error) {
			c, s := net.Pipe()
			go batchServer(s, service, 2, 1)
			return c, nil
		}}
		defer tr.Close()
		var a1, a2, a3 attempt.Attempt
		done := make(chan *attempt.Attempt, 3)
		finish := func(a *attempt.Attempt) func(*http.Response, error) {
			return func(resp *http.Response, err error) {
				if err != nil {
					t.Errorf("exchange: %v", err)
				} else {
					io.ReadAll(resp.Body)
				}
				done <- a
			}
		}
		req := func(path string) *http.Request {
			r, _ := http.NewRequest("GET", "http://127.0.0.1"+path, nil)
			return r
		}
		first := true
		tr.Start(req("/1"), &a1, func(resp *http.Response, err error) {
			if first {
				first = false
				tr.Start(req("/3"), &a3, finish(&a3)) // inside the reader's batch
				time.Sleep(5 * time.Millisecond)      // a slow completion
			}
			finish(&a1)(resp, err)
		})
		synctest.Wait() // stream 1 is out before stream 2, so it is answered first
		tr.Start(req("/2"), &a2, finish(&a2))
		for range 3 {
			<-done
		}
		for _, c := range []struct {
			name string
			a    *attempt.Attempt
		}{{"first", &a1}, {"second, read with the first", &a2}, {"third, started in the batch", &a3}} {
			d, ok := c.a.Upstream()
			if !ok || d != service {
				t.Errorf("%s: upstream share %v (recorded %v), want the service time %v", c.name, d, ok, service)
			}
		}
	})
}

// FuzzUnindexed: appendUnindexed's fields decode, with net/http's HPACK decoder, to what was
// encoded, and leave the decoder's dynamic table empty.
func FuzzUnindexed(f *testing.F) {
	f.Add(uint8(staticPath), "", "/profile/user-42?x=1")
	f.Add(uint8(0), "idempotency-key", "")
	f.Add(uint8(0), "x", string(bytes.Repeat([]byte{0xff}, 300)))
	f.Fuzz(func(t *testing.T, idx uint8, name, value string) {
		nameIdx := uint64(idx % 62) // the static table has 61 entries
		want := name
		if nameIdx != 0 {
			want = staticName(t, nameIdx)
		} else if name == "" {
			t.Skip()
		}
		var got []hpack.HeaderField
		d := hpack.NewDecoder(4096, func(f hpack.HeaderField) { got = append(got, f) })
		d.SetMaxStringLength(1 << 20)
		if _, err := d.Write(appendUnindexed(nil, nameIdx, name, value)); err != nil {
			t.Fatalf("decode: %v", err)
		}
		if err := d.Close(); err != nil {
			t.Fatalf("decode: %v", err)
		}
		if len(got) != 1 || got[0].Name != want || got[0].Value != value || got[0].Sensitive {
			t.Fatalf("decoded %+v, want %q: %q", got, want, value)
		}
		// The field was not indexed: a reference to the first dynamic entry must fail.
		if _, err := d.DecodeFull([]byte{0x80 | 62}); err == nil {
			t.Fatal("the field was added to the dynamic table")
		}
	})
}

// staticName is the name of HPACK's static table entry i, as the decoder reads it.
func staticName(t *testing.T, i uint64) string {
	d := hpack.NewDecoder(4096, nil)
	fs, err := d.DecodeFull(appendInt(nil, 7, 0x80, i))
	if err != nil || len(fs) != 1 {
		t.Fatalf("static entry %d: %v", i, err)
	}
	return fs[0].Name
}
