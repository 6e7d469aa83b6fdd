package lookup

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// procServer runs a benchmark upstream (rawServer, loopServer or h2Server) in a child
// process: this test binary again, which serves instead of testing (see TestMain). An
// upstream is another service, with its own threads and its own Go scheduler; in the same
// process the two would share one scheduler, and the upstream's goroutines would wait for
// the client's to yield before they see their sockets ready, which on two vCPUs adds up to
// a millisecond to every exchange and measures neither. The child reports the service time
// it delivered and the CPU it used over a pipe.
type procServer struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	addr string
}

const procServerEnv = "LOOKUP_BENCH_UPSTREAM" // kind,service: "h2,2ms"

func TestMain(m *testing.M) {
	if spec := os.Getenv(procServerEnv); spec != "" {
		serveChild(spec)
		return
	}
	os.Exit(m.Run())
}

func newProcServer(tb testing.TB, kind string, service time.Duration) *procServer {
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), procServerEnv+"="+kind+","+service.String())
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	s := &procServer{cmd: cmd, in: in, out: bufio.NewReader(outp)}
	tb.Cleanup(func() {
		in.Close() // the child exits when its stdin closes
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	line, err := s.out.ReadString('\n')
	if err != nil {
		tb.Fatalf("upstream process: %v", err)
	}
	s.addr = strings.TrimSpace(line)
	if !strings.HasPrefix(s.addr, "127.0.0.1:") {
		tb.Fatalf("upstream process listens on %q, want 127.0.0.1", s.addr)
	}
	return s
}

func (s *procServer) url() string { return "http://" + s.addr }

// stats asks the child for the mean service time since the last call and its CPU time.
func (s *procServer) stats() (svc, cpu time.Duration) {
	if _, err := io.WriteString(s.in, "stats\n"); err != nil {
		return 0, 0
	}
	line, err := s.out.ReadString('\n')
	if err != nil {
		return 0, 0
	}
	f := strings.Fields(line)
	if len(f) != 2 {
		return 0, 0
	}
	a, _ := strconv.ParseInt(f[0], 10, 64)
	b, _ := strconv.ParseInt(f[1], 10, 64)
	return time.Duration(a), time.Duration(b)
}

func (s *procServer) meanService() time.Duration {
	svc, _ := s.stats()
	return svc
}

// childUpstreams are the upstreams a child process can run ("loop" is added on Linux).
var childUpstreams = map[string]func(tb testing.TB, service time.Duration) benchServer{
	"h2":  func(tb testing.TB, service time.Duration) benchServer { return newH2Server(tb, service) },
	"raw": func(tb testing.TB, service time.Duration) benchServer { return newRawServer(tb, service, 0) },
}

// serveChild is the child's side: start the upstream, print its address, and answer
// "stats" lines until stdin closes.
func serveChild(spec string) {
	kind, svcStr, _ := strings.Cut(spec, ",")
	service, err := time.ParseDuration(svcStr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bad", procServerEnv, spec)
		os.Exit(2)
	}
	tb := &childTB{}
	start, ok := childUpstreams[kind]
	if !ok {
		fmt.Fprintln(os.Stderr, "unknown upstream", kind)
		os.Exit(2)
	}
	s := start(tb, service)
	fmt.Println(strings.TrimPrefix(s.url(), "http://"))
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "stats" {
			fmt.Println(int64(s.meanService()), int64(cpuTime()))
		}
	}
	tb.cleanup()
	os.Exit(0)
}

// childTB is the testing.TB the fixtures get in the child process.
type childTB struct {
	testing.TB
	cleanups []func()
}

func (t *childTB) Cleanup(f func()) { t.cleanups = append(t.cleanups, f) }
func (t *childTB) Helper()          {}
func (t *childTB) Fatal(args ...any) {
	fmt.Fprintln(os.Stderr, args...)
	os.Exit(2)
}
func (t *childTB) Fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(2)
}
func (t *childTB) Errorf(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
func (t *childTB) Logf(format string, args ...any)   {}

func (t *childTB) cleanup() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}
