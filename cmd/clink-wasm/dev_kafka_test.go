package main

import (
	"bytes"
	"context"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// lineWriter is a goroutine-safe buffer that signals when its first line is complete.
type lineWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	line chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	had := bytes.IndexByte(w.buf.Bytes(), '\n') >= 0
	w.buf.Write(p)
	if i := bytes.IndexByte(w.buf.Bytes(), '\n'); !had && i >= 0 {
		w.line <- string(w.buf.Bytes()[:i])
	}
	return len(p), nil
}

// TestDevKafka runs `clink-wasm dev kafka` in process on a free port, reads the brokers line
// it prints, checks the flagged topics exist with their partition counts and that a record
// round-trips, then stops it by cancelling (as SIGINT does) and expects exit status 0.
func TestDevKafka(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &lineWriter{line: make(chan string, 1)}
	var errb lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"dev", "kafka", "--port", "0", "--topic", "in:3", "--topic", "out"}, nil, out, &errb)
	}()
	var line string
	select {
	case line = <-out.line:
	case code := <-done:
		t.Fatalf("dev kafka exited %d before printing brokers: %s", code, errb.String())
	}
	m := regexp.MustCompile(`^brokers: \["(127\.0\.0\.1:\d+)"\]$`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("brokers line %q", line)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(m[1]), kgo.DefaultProduceTopic("out"), kgo.ConsumeTopics("out"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	md, err := kadm.NewClient(cl).Metadata(ctx, "in", "out")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(md.Topics["in"].Partitions); n != 3 {
		t.Errorf("topic in has %d partitions, want 3", n)
	}
	if n := len(md.Topics["out"].Partitions); n != 1 {
		t.Errorf("topic out has %d partitions, want 1", n)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("hello")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	fs := cl.PollFetches(ctx)
	if recs := fs.Records(); len(recs) != 1 || string(recs[0].Value) != "hello" {
		t.Fatalf("fetched %v, errors %v", recs, fs.Errors())
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(errb.String(), "in:3,out:1") {
		t.Errorf("stderr does not list the topics: %q", errb.String())
	}
}

func TestDevKafkaUsage(t *testing.T) {
	for _, args := range [][]string{
		{"dev"},
		{"dev", "zookeeper"},
		{"dev", "kafka", "--topic", "bad name:1"},
		{"dev", "kafka", "--topic", "t:0"},
		{"dev", "kafka", "--port", "70000"},
	} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, nil, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, code, errb.String())
		}
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestDevKafkaPortInUse: a taken port is exit status 1 with a message that says what to do.
func TestDevKafkaPortInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"dev", "kafka", "--port", port}, nil, &out, &errb); code != 1 || !strings.Contains(errb.String(), "try --port") {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
}
