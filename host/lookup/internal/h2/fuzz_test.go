package h2

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/lookup/internal/attempt"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// FuzzServerFrames: whatever a server sends after its SETTINGS, the client neither panics
// nor hangs: every exchange ends exactly once (with a response within the limits, or an
// error), and Close returns. Run: go test -run XXX -fuzz FuzzServerFrames ./host/lookup/internal/h2/
func FuzzServerFrames(f *testing.F) {
	seed := func(build func(fr *http2.Framer, enc *hpack.Encoder, hb *bytes.Buffer)) []byte {
		var out, hb bytes.Buffer
		fr := http2.NewFramer(&out, nil)
		enc := hpack.NewEncoder(&hb)
		build(fr, enc, &hb)
		return out.Bytes()
	}
	head := func(fr *http2.Framer, enc *hpack.Encoder, hb *bytes.Buffer, id uint32, status string, end bool, fields ...string) {
		hb.Reset()
		enc.WriteField(hpack.HeaderField{Name: ":status", Value: status})
		for i := 0; i+1 < len(fields); i += 2 {
			enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
		}
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true, EndStream: end})
	}
	f.Add(seed(func(fr *http2.Framer, enc *hpack.Encoder, hb *bytes.Buffer) {
		for _, id := range []uint32{1, 3, 5} {
			head(fr, enc, hb, id, "200", false, "content-length", "2")
			fr.WriteData(id, true, []byte("ok"))
		}
	}))
	f.Add(seed(func(fr *http2.Framer, enc *hpack.Encoder, hb *bytes.Buffer) {
		head(fr, enc, hb, 1, "100", false)
		head(fr, enc, hb, 1, "204", true)
		fr.WriteRSTStream(3, http2.ErrCodeRefusedStream)
		fr.WriteGoAway(3, http2.ErrCodeNo, nil)
		head(fr, enc, hb, 3, "200", false)
		fr.WriteData(3, false, []byte("abc"))
		head(fr, enc, hb, 3, "200", true, "x-trailer", "t")
	}))
	f.Add(seed(func(fr *http2.Framer, enc *hpack.Encoder, hb *bytes.Buffer) {
		fr.WritePing(false, [8]byte{1})
		fr.WriteWindowUpdate(0, 1<<20)
		fr.WriteSettings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 1})
		head(fr, enc, hb, 1, "200", false, "content-length", "100000")
		fr.WriteData(1, false, bytes.Repeat([]byte("x"), 5000))
	}))
	f.Fuzz(func(t *testing.T, frames []byte) {
		tr := &Transport{
			MaxBodyBytes: 4096, MaxResponseHeaderBytes: 1024,
			Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
				c, s := net.Pipe()
				go func() {
					defer s.Close()
					go io.Copy(io.Discard, s) // the client's frames
					var out bytes.Buffer
					http2.NewFramer(&out, nil).WriteSettings()
					s.Write(out.Bytes())
					s.Write(frames)
				}()
				return c, nil
			},
		}
		const n = 3
		done := make(chan struct{}, 2*n)
		for range n {
			var a attempt.Attempt
			a.Reset(time.Now().Add(30 * time.Millisecond))
			req, _ := http.NewRequest("GET", "http://127.0.0.1/x", nil)
			tr.Start(req, &a, func(resp *http.Response, err error) {
				if err == nil {
					b, _ := io.ReadAll(resp.Body)
					if len(b) > 4096 || resp.StatusCode < 200 {
						t.Errorf("accepted status %d with %d body bytes", resp.StatusCode, len(b))
					}
				}
				done <- struct{}{}
			})
		}
		timeout := time.After(3 * time.Second)
		for range n {
			select {
			case <-done:
			case <-timeout:
				t.Fatal("an exchange never ended")
			}
		}
		tr.Close()
		select {
		case <-done:
			t.Fatal("an exchange ended twice")
		default:
		}
	})
}
