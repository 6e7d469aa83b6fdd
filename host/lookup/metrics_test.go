package lookup

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestHistogramBuckets(t *testing.T) {
	var h Histogram
	for i := 0; i < 100000; i++ {
		d := time.Duration(rand.Int64N(int64(100 * time.Second)))
		if i%3 == 0 {
			d = time.Duration(rand.Int64N(int64(time.Millisecond)))
		}
		b := bucketOf(d)
		low, high := h.Bucket(b)
		if d.Truncate(time.Microsecond) < low || (b < histBuckets-1 && d >= high) {
			t.Fatalf("%v in bucket %d [%v, %v)", d, b, low, high)
		}
		if b >= 4 && float64(high) > 1.25*float64(low)+1 {
			t.Fatalf("bucket %d [%v, %v) wider than 25%%", b, low, high)
		}
	}
	var r histogram
	for i := 1; i <= 1000; i++ {
		r.record(time.Duration(i) * time.Millisecond)
	}
	s := r.snapshot()
	if q := s.Quantile(0.5); q < 500*time.Millisecond || q > 625*time.Millisecond {
		t.Fatalf("p50 %v", q)
	}
	if q := s.Quantile(0.99); q < 990*time.Millisecond || q > 1240*time.Millisecond {
		t.Fatalf("p99 %v", q)
	}
	if m := s.Mean(); m != 500500*time.Microsecond {
		t.Fatalf("mean %v", m)
	}
}
