package scheduler

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/abi"
	"github.com/clink-wasm/clink-wasm/host/lookup"
	"github.com/clink-wasm/clink-wasm/host/state"
)

// upstreamEnv makes this test binary serve as the whole-path benchmark's upstream instead of
// testing (see TestMain): "2ms" is the service time.
const upstreamEnv = "CLINK_SCHEDULER_BENCH_UPSTREAM"

func TestMain(m *testing.M) {
	if svc := os.Getenv(upstreamEnv); svc != "" {
		serveUpstream(svc)
		return
	}
	os.Exit(m.Run())
}

// serveUpstream is a plain net/http service on loopback answering every request after the
// service time with a small JSON body. It prints its address, then serves until its stdin
// closes.
func serveUpstream(svc string) {
	d, err := time.ParseDuration(svc)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true) // h2c with prior knowledge, for the "h2c" transport
	srv := &http.Server{Protocols: &protocols, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(d)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"path":%q,"tier":"gold","score":42}`, r.URL.Path)
	})}
	go srv.Serve(ln)
	fmt.Println(ln.Addr().String())
	io.Copy(io.Discard, os.Stdin)
}

// startUpstream runs serveUpstream in a child process: an upstream is another service, with its
// own threads and scheduler, and its CPU must not count as the client's.
func startUpstream(b *testing.B, svc time.Duration) string {
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), upstreamEnv+"="+svc.String())
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		in.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	addr, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		b.Fatalf("upstream process: %v", err)
	}
	addr = strings.TrimSpace(addr)
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		b.Fatalf("upstream listens on %q, want 127.0.0.1", addr)
	}
	return "http://" + addr
}

// enrichJob runs one whole enrichment job: every record's guest call sends a lookup through a
// real lookup.Endpoint (the default transport, h1) to the loopback upstream, suspends until
// the answer, and emits it. It returns the records per second, the client's CPU per record
// (the whole process: guest calls, scheduler, lookup, output) and the endpoint's concurrency
// limit at the end.
func enrichJob(b *testing.B, m *abi.Module, url, transport, algorithm string, els []Element) (recPerSec float64, cpuPerRec time.Duration, limit int) {
	return enrichJobAt(b, m, url, transport, algorithm, 0, els)
}

// enrichJobAt is enrichJob with the endpoint's max_in_flight (0: the default, 256), which is
// the limit of the "fixed" algorithm and the ceiling of the adaptive ones. The endpoint's
// queue holds every lookup the scheduler can have in flight whatever the limit: its cap of 512
// (a module that makes lookups keeps that cap while it drains too, see fetchCap).
func enrichJobAt(b *testing.B, m *abi.Module, url, transport, algorithm string, maxInFlight int, els []Element) (recPerSec float64, cpuPerRec time.Duration, limit int) {
	reg := lookup.NewRegistry()
	ep, err := reg.Open("bench", lookup.EndpointConfig{
		Name: "svc", BaseURL: url, Transport: transport,
		MaxInFlight: maxInFlight, MaxQueued: 512,
		Egress:      lookup.EgressPolicy{AllowLoopback: true},
		Concurrency: lookup.ConcurrencyConfig{Algorithm: algorithm},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer ep.Close()
	// What host/pipeline does (openLookups): the guest's bytes through DoRaw.
	lookupFn := func(ctx context.Context, _ uint32, raw []byte, done func(int, []byte, error)) {
		ep.DoRaw(ctx, raw, func(r lookup.Response) {
			if r.Err != nil {
				done(0, nil, fmt.Errorf("%w: %w", abi.Code(lookup.Kind(r.Err).ABICode()), r.Err))
				return
			}
			done(r.Status, r.Body, nil)
		})
	}
	sink := &discardSink{}
	// Twice the endpoint's 256 in flight: enough to keep it full, within its queue.
	c, err := New(m, state.NewMemory(), sink, WithLookup(lookupFn), WithMaxInFlight(512))
	if err != nil {
		b.Fatal(err)
	}
	ch := make(chan []Element, len(els)/256+2)
	for i := 0; i < len(els); i += 256 {
		ch <- els[i:min(i+256, len(els))]
	}
	close(ch)
	cpu0, t0 := processCPU(), time.Now()
	if err := c.Run(context.Background(), ch); err != nil {
		b.Fatal(err)
	}
	wall, cpu := time.Since(t0), processCPU()-cpu0
	if n := sink.outputs.Load(); n != int64(len(els)) {
		b.Fatalf("%d outputs for %d records", n, len(els))
	}
	lm := ep.Metrics()
	if lm.Statuses[2] != uint64(len(els)) {
		b.Fatalf("%d lookups answered 2xx for %d records (errors by kind %v)", lm.Statuses[2], len(els), lm.Errors)
	}
	return float64(len(els)) / wall.Seconds(), cpu / time.Duration(len(els)), lm.Limit
}

// BenchmarkEnrichPath is issue 11's whole-path figure: a keyed enrichment job (20k records
// over 10k keys, one lookup each, a 2 ms upstream in its own process on loopback) through the
// scheduler and a real lookup endpoint, with the default limiter and with a fixed limit of
// 256, alternating, side by side. Reported: the client's CPU per enriched record (target
// ≤ 20 µs), and the default limiter's throughput ÷ the fixed limit's (target ≥ 0.95).
// h1 is the default transport; h2c (the same upstream, HTTP/2 with prior knowledge) is what
// an upstream that speaks it allows.
func BenchmarkEnrichPath(b *testing.B) {
	m := loadModule(b, "testdata/enrich.wasm")
	url := startUpstream(b, 2*time.Millisecond)
	els := enrichRecords(20_000)
	for _, transport := range []string{"h1", "h2c"} {
		b.Run(transport, func(b *testing.B) {
			enrichJob(b, m, url, transport, "fixed", els[:2000]) // warm up: connections, code paths
			for b.Loop() {
				var defRate, fixRate, defCPU, fixCPU, defLimit []float64
				for r := range 4 {
					runs := []func(){
						func() {
							rate, cpu, limit := enrichJob(b, m, url, transport, "", els)
							defRate, defCPU = append(defRate, rate), append(defCPU, float64(cpu.Nanoseconds())/1e3)
							defLimit = append(defLimit, float64(limit))
						},
						func() {
							rate, cpu, _ := enrichJob(b, m, url, transport, "fixed", els)
							fixRate, fixCPU = append(fixRate, rate), append(fixCPU, float64(cpu.Nanoseconds())/1e3)
						},
					}
					if r%2 == 1 {
						slices.Reverse(runs)
					}
					for _, f := range runs {
						f()
					}
				}
				b.ReportMetric(median(defCPU), "default-cpu-µs/rec")
				b.ReportMetric(median(fixCPU), "fixed-cpu-µs/rec")
				b.ReportMetric(median(defRate), "default-rec/s")
				b.ReportMetric(median(fixRate), "fixed-rec/s")
				b.ReportMetric(medianRatio(defRate, fixRate), "default/fixed-throughput")
				// Where the default limiter settled: below 256 it judged the upstream to be
				// queueing (its latency above 1.5 × the baseline it measured at 4 in flight).
				b.ReportMetric(median(defLimit), "default-final-limit")
			}
		})
	}
}

// BenchmarkEnrichLimits is BenchmarkEnrichPath's job with the default limiter against fixed
// limits of 64, 128 and 256, in rotating order, so that "default ÷ the best fixed limit" is
// measured rather than assumed to be 256. Reported per limit: records/s (median over rounds),
// and the default's throughput ÷ the best fixed limit's (per round, then the median).
func BenchmarkEnrichLimits(b *testing.B) {
	m := loadModule(b, "testdata/enrich.wasm")
	url := startUpstream(b, 2*time.Millisecond)
	els := enrichRecords(20_000)
	fixed := []int{64, 128, 256}
	for _, transport := range []string{"h1", "h2c"} {
		b.Run(transport, func(b *testing.B) {
			enrichJob(b, m, url, transport, "fixed", els[:2000]) // warm up
			for b.Loop() {
				rates := make([][]float64, len(fixed)+1) // [0]: default
				var defLimit []float64
				for r := range 3 {
					for i := range len(fixed) + 1 {
						j := (i + r) % (len(fixed) + 1)
						if j == 0 {
							rate, _, limit := enrichJob(b, m, url, transport, "", els)
							rates[0] = append(rates[0], rate)
							defLimit = append(defLimit, float64(limit))
							continue
						}
						rate, _, _ := enrichJobAt(b, m, url, transport, "fixed", fixed[j-1], els)
						rates[j] = append(rates[j], rate)
					}
				}
				best := make([]float64, len(rates[0]))
				bestMedian := 0.0
				for j := 1; j < len(rates); j++ {
					b.ReportMetric(median(rates[j]), fmt.Sprintf("fixed%d-rec/s", fixed[j-1]))
					bestMedian = max(bestMedian, median(rates[j]))
					for r, x := range rates[j] {
						best[r] = max(best[r], x)
					}
				}
				b.ReportMetric(median(rates[0]), "default-rec/s")
				b.ReportMetric(medianRatio(rates[0], best), "default/best-fixed")
				// "The best of three" is the largest of three noisy runs, so a fixed limit
				// scores below 1 against it too when the limits deliver alike (h1 on a
				// CPU-bound host): fixed256/best-fixed is that statistic's floor, and
				// default/best-median-fixed compares the default with the limit whose median
				// rate is the highest, which takes no maximum per round.
				for j := 1; j < len(rates); j++ {
					b.ReportMetric(medianRatio(rates[j], best), fmt.Sprintf("fixed%d/best-fixed", fixed[j-1]))
				}
				b.ReportMetric(median(rates[0])/bestMedian, "default/best-median-fixed")
				b.ReportMetric(median(defLimit), "default-final-limit")
			}
		})
	}
}

// enrichRecords is the enrichment benchmarks' input: n records over n/2 keys, each a lookup
// of its key's profile.
func enrichRecords(n int) []Element {
	els := make([]Element, n)
	for i := range els {
		k := fmt.Sprintf("user-%d", i%(n/2))
		els[i] = Element{Kind: ElementRecord, Key: []byte(k), Value: fmt.Appendf(nil, "GET /profile/%s", k), Pos: int64(i + 1)}
	}
	return els
}
