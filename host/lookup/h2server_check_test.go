package lookup

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// TestH2ServerFixture checks h2Server against the standard library's h2c client: many
// concurrent streams, request bodies beyond the stream and connection receive windows (so
// the server must return the credit), and the service time it reports.
func TestH2ServerFixture(t *testing.T) {
	const service = 2 * time.Millisecond
	s := newH2Server(t, service)
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &p}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}

	check := func(what string, resp *http.Response, err error) {
		if err != nil {
			t.Errorf("%s: %v", what, err)
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != 200 || string(body) != "ok" || resp.ProtoMajor != 2 {
			t.Errorf("%s: %s %s %q %v", what, resp.Proto, resp.Status, body, err)
		}
	}

	const total, workers = 512, 256
	var left atomic.Int64
	left.Store(total)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				resp, err := client.Get(s.url() + "/")
				check("GET", resp, err)
			}
		})
	}
	wg.Wait()

	// 200 KiB, then 6 × 3 MiB: beyond the 1 MiB stream and 16 MiB connection windows.
	resp, err := client.Post(s.url()+"/", "application/octet-stream", bytes.NewReader(make([]byte, 200<<10)))
	check("POST 200 KiB", resp, err)
	big := make([]byte, 3<<20)
	for range 6 {
		resp, err := client.Post(s.url()+"/", "application/octet-stream", bytes.NewReader(big))
		check("POST 3 MiB", resp, err)
	}

	// Not a speed check: a request's service is part of its life, which the client bounds
	// (5s, and every request above succeeded), and the fixture sleeps at least service.
	if svc := s.meanService(); svc < service || svc >= client.Timeout {
		t.Errorf("meanService = %v, want in [%v, %v)", svc, service, client.Timeout)
	}
	if svc := s.meanService(); svc != 0 {
		t.Errorf("meanService after reset = %v, want 0", svc)
	}
}

// TestH2ServerFixtureFrames checks, with raw frames, what the standard client does not
// exercise: PING, response DATA held for send window, RST_STREAM dropping a queued response.
func TestH2ServerFixtureFrames(t *testing.T) {
	s := newH2Server(t, 2*time.Millisecond)
	nc, err := net.Dial("tcp", strings.TrimPrefix(s.url(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	fr := http2.NewFramer(nc, nc)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	var hbuf bytes.Buffer
	henc := hpack.NewEncoder(&hbuf)
	get := func(id uint32) {
		hbuf.Reset()
		for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":path", "/"}, {":authority", "x"}} {
			henc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hbuf.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
	}
	read := func(wait time.Duration) (http2.Frame, error) {
		nc.SetReadDeadline(time.Now().Add(wait))
		return fr.ReadFrame()
	}
	must := func(wait time.Duration) http2.Frame {
		t.Helper()
		f, err := read(wait)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	expectHeaders := func(id uint32) {
		t.Helper()
		f, ok := must(time.Second).(*http2.MetaHeadersFrame)
		if !ok || f.StreamID != id || f.PseudoValue("status") != "200" || f.StreamEnded() {
			t.Fatalf("want HEADERS :status 200 on stream %d, got %v", id, f)
		}
	}
	expectData := func(id uint32) {
		t.Helper()
		f, ok := must(time.Second).(*http2.DataFrame)
		if !ok || f.StreamID != id || string(f.Data()) != "ok" || !f.StreamEnded() {
			t.Fatalf("want DATA ok END_STREAM on stream %d, got %v", id, f)
		}
	}

	// Preface, SETTINGS with a zero stream window, PING.
	io.WriteString(nc, http2.ClientPreface)
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	fr.WritePing(false, [8]byte{1, 2, 3})
	var settings, winUpdate, ack, pong bool
	for !(settings && winUpdate && ack && pong) {
		switch f := must(time.Second).(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				ack = true
			} else {
				settings = true
				if v, _ := f.Value(http2.SettingMaxConcurrentStreams); v != h2MaxStreams {
					t.Errorf("MAX_CONCURRENT_STREAMS = %d", v)
				}
				if v, _ := f.Value(http2.SettingInitialWindowSize); v != h2StreamWindow {
					t.Errorf("INITIAL_WINDOW_SIZE = %d", v)
				}
			}
		case *http2.WindowUpdateFrame:
			winUpdate = f.StreamID == 0 && f.Increment == h2ConnWindow-h2DefaultWindow
		case *http2.PingFrame:
			pong = f.IsAck() && f.Data == [8]byte{1, 2, 3}
		default:
			t.Fatalf("unexpected %v", f)
		}
	}

	// Stream 1 gets its HEADERS, but its DATA waits for window; stream 3 is reset before due.
	get(1)
	get(3)
	fr.WriteRSTStream(3, http2.ErrCodeCancel)
	expectHeaders(1)
	if f, err := read(20 * time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("want nothing without send window, got %v %v", f, err)
	}
	fr.WriteWindowUpdate(1, 2)
	expectData(1)

	// With window again, stream 5 is answered at once, and nothing of stream 3 comes first.
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 65535})
	if f, ok := must(time.Second).(*http2.SettingsFrame); !ok || !f.IsAck() {
		t.Fatalf("want SETTINGS ACK, got %v", f)
	}
	get(5)
	expectHeaders(5)
	expectData(5)
	if svc := s.meanService(); svc < 2*time.Millisecond {
		t.Errorf("meanService = %v", svc)
	}
}
