package lookup

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/clink-wasm/clink-wasm/host/uring"
)

// BenchmarkTransport runs the throughput workload (2 ms service, closed loop) with the
// standard dialer and with host/uring's experimental io_uring Dialer, same run, at two
// levels of concurrency. The egress guard and the loopback-only check stay in front of both.
func BenchmarkTransport(b *testing.B) {
	for _, inflight := range []int{16, 256} {
		for _, tr := range []string{"std", "uring"} {
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
				e := open(b, NewRegistry(WithDialer(dial)), "bench", benchConfig(s.url(), inflight, "fixed"))
				closedLoopErrs(b, e, inflight, 10*inflight, false)
				s.meanService()
				b.ResetTimer()
				total := max(b.N, 4*inflight)
				el, h, errs := closedLoopErrs(b, e, inflight, total, false)
				b.StopTimer()
				reportThroughput(b, float64(total)/el.Seconds(), inflight, s.meanService(), h)
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
