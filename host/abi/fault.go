package abi

import (
	"errors"
	"fmt"
	"strings"

	"github.com/tetratelabs/wazero/sys"
)

// FaultKind classifies a guest fault (docs/abi.md, "Faults").
type FaultKind uint8

// Fault kinds.
const (
	FaultTrap        FaultKind = iota // a WebAssembly trap
	FaultReturn                       // an export returned a non-zero status
	FaultTimeLimit                    // the call ran past its time budget
	FaultExit                         // the guest called proc_exit
	FaultOutOfMemory                  // the guest could not allocate (input buffer, memory limit)
	FaultHost                         // a host-side refusal that must stop the call (e.g. invalid output)
	FaultCancelled                    // the instance's context was cancelled mid-call
	FaultABI                          // the guest broke the ABI (a malformed output area or frame)
)

func (k FaultKind) String() string {
	switch k {
	case FaultTrap:
		return "trap"
	case FaultReturn:
		return "error return"
	case FaultTimeLimit:
		return "time limit"
	case FaultExit:
		return "exit"
	case FaultOutOfMemory:
		return "out of memory"
	case FaultHost:
		return "host error"
	case FaultCancelled:
		return "cancelled"
	case FaultABI:
		return "ABI violation"
	}
	return "fault"
}

// Fault is a failed guest call. The instance that faulted is broken and must be discarded; the
// error says which operator, which export and why, in the guest's own words when it gave any.
// The scheduler wraps it with the record or timer that was being processed.
type Fault struct {
	Operator     string
	Export       string
	Kind         FaultKind
	Code         int32  // the non-zero status (FaultReturn) or exit code (FaultExit)
	GuestMessage string // the guest's last error-level log line, or its first stderr line
	MemoryBytes  uint64 // linear memory size at the fault, when relevant
	MemoryLimit  uint64 // the memory limit, when relevant
	Err          error  // the underlying error, if any
}

func (f *Fault) Error() string {
	return fmt.Sprintf("operator %q: %s", f.Operator, f.Detail())
}

// Detail describes the fault without naming the operator, for callers that add their own context.
func (f *Fault) Detail() string {
	var b strings.Builder
	if f.Export != "" {
		b.WriteString(f.Export)
	} else {
		b.WriteString("call")
	}
	switch f.Kind {
	case FaultReturn:
		fmt.Fprintf(&b, " returned error status %d", f.Code)
	case FaultExit:
		fmt.Fprintf(&b, " called proc_exit(%d)", f.Code)
	case FaultTimeLimit:
		b.WriteString(" exceeded its time limit")
	case FaultCancelled:
		b.WriteString(" was cancelled")
	case FaultOutOfMemory:
		b.WriteString(" ran out of memory")
	case FaultHost:
		b.WriteString(" was stopped by the host")
	case FaultABI:
		b.WriteString(" broke the ABI")
	default:
		b.WriteString(" trapped")
	}
	if f.Err != nil && f.Kind != FaultExit {
		msg := f.Err.Error()
		// wazero appends the wasm stack trace after the first line; keep it, indented, because
		// it names the guest functions involved.
		msg = strings.ReplaceAll(strings.TrimSpace(msg), "\n", "\n    ")
		fmt.Fprintf(&b, ": %s", msg)
	}
	if f.MemoryBytes > 0 {
		fmt.Fprintf(&b, " (linear memory is %d KiB", f.MemoryBytes>>10)
		if f.MemoryLimit > 0 {
			fmt.Fprintf(&b, " of a %d KiB limit", f.MemoryLimit>>10)
		}
		b.WriteByte(')')
	}
	if f.GuestMessage != "" {
		fmt.Fprintf(&b, "; guest said: %q", f.GuestMessage)
	}
	return b.String()
}

func (f *Fault) Unwrap() error { return f.Err }

// HostError is returned by a Handler to abort the guest call with a message of the host's, for
// example when the guest emits a value the output format rejects.
type HostError struct{ Err error }

func (e *HostError) Error() string { return e.Err.Error() }
func (e *HostError) Unwrap() error { return e.Err }

// errTimeLimit and errCancelled are panicked by the fuel check to abort a call.
type budgetError struct {
	cancelled bool
	cause     error
}

func (e *budgetError) Error() string {
	if e.cancelled {
		return "cancelled: " + e.cause.Error()
	}
	return e.cause.Error()
}

func (e *budgetError) Unwrap() error { return e.cause }

// fault classifies the error of a failed export call.
func (in *Instance) fault(k callKind, err error) error {
	var inner *Fault
	if errors.As(err, &inner) {
		return inner // raised by the host inside the call (output area, frames)
	}
	f := &Fault{Operator: in.m.Manifest.Name, Export: callExport[k], Kind: FaultTrap, Err: err, GuestMessage: in.guestMessage()}
	var be *budgetError
	var he *HostError
	var exit *sys.ExitError
	switch {
	case errors.As(err, &be):
		f.Err = be.cause
		f.Kind = FaultTimeLimit
		if be.cancelled {
			f.Kind = FaultCancelled
		}
	case errors.As(err, &he):
		f.Kind = FaultHost
		f.Err = he.Err
	case errors.As(err, &exit):
		f.Kind = FaultExit
		f.Code = int32(exit.ExitCode())
	}
	if in.mem != nil && f.Kind == FaultTrap {
		// A trap with memory near its limit is almost always a failed allocation (memory.grow
		// returned -1 and the guest went on): say so. Allocators grow in steps, so "near" is
		// the top quarter.
		if limit := uint64(in.m.e.memoryPages()) << 16; uint64(in.mem.Size())*4 >= limit*3 {
			f.Kind = FaultOutOfMemory
			f.MemoryBytes = uint64(in.mem.Size())
			f.MemoryLimit = limit
		}
	}
	return f
}
