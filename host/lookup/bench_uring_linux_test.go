package lookup

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/uring"
)

// BenchmarkTransport runs the throughput workload (2 ms service, closed loop) with
// net/http's Transport ("std"), the lean transport ("h1") and net/http over host/uring's
// experimental io_uring Dialer ("uring"), same run, at two levels of concurrency. The egress
// guard and the loopback-only check stay in front of all three.
func BenchmarkTransport(b *testing.B) {
	for _, inflight := range []int{16, 256} {
		for _, tr := range []string{"std", "h1", "uring"} {
			b.Run(tr+"/inflight="+itoa(inflight), func(b *testing.B) {
				check, _ := loopbackOnly(b)
				dial := check
				if tr == "uring" {
					if err := uring.Available(); err != nil {
						b.Skipf("io_uring unavailable: %v", err)
					}
					r, err := uring.New(uring.WithBackend(uring.BackendIOUring))
					if err != nil {
						b.Skip(err)
					}
					defer r.Close()
					d := &uring.Dialer{Reactor: r}
					dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
						if _, err := check(ctx, network, addr); err != nil { // asserts 127.0.0.1
							return nil, err
						}
						return d.DialContext(ctx, network, addr)
					}
				}
				const service = 2 * time.Millisecond
				s := newRawServer(b, service, 0)
				httpImpl := tr
				if tr == "uring" {
					httpImpl = "std" // as measured before h1 existed: only the dialer differs
				}
				e := open(b, NewRegistry(WithDialer(dial)), "bench", benchConfigT(s.url(), inflight, "fixed", httpImpl))
				closedLoopErrs(b, e, inflight, 10*inflight, false)
				s.meanService()
				total := max(b.N, 4*inflight)
				cpu := startCPU()
				b.ResetTimer()
				el, h, errs := closedLoopErrs(b, e, inflight, total, false)
				b.StopTimer()
				reportThroughput(b, float64(total)/el.Seconds(), inflight, s.meanService(), h)
				cpu.report(b, total)
				b.ReportMetric(float64(errs), "failed")
			})
		}
	}
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}
