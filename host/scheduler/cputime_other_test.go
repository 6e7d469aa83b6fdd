//go:build !linux

package scheduler

import "time"

// threadCPU is not measured outside Linux: the CPU ratios then report NaN.
func threadCPU() time.Duration { return 0 }
