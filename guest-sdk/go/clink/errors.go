package clink

import (
	"strconv"

	"github.com/clink-wasm/clink-wasm/guest-sdk/go/clink/internal/abi"
)

// Code is a negative ABI v1 result code (docs/abi.md, "Result codes").
type Code int32

// The result codes an import can return.
const (
	CodeNotFound               Code = abi.NotFound
	CodeInvalidArgument        Code = abi.InvalidArgument
	CodeOutOfBounds            Code = abi.OutOfBounds
	CodeTooLarge               Code = abi.TooLarge
	CodeNotAllowed             Code = abi.NotAllowed
	CodeNoResult               Code = abi.NoResult
	CodeBufferTooSmall         Code = abi.BufferTooSmall
	CodeLookupTimeout          Code = abi.LookupTimeout
	CodeLookupBreakerOpen      Code = abi.LookupBreakerOpen
	CodeLookupResponseTooLarge Code = abi.LookupResponseTooLarge
	CodeLookupRefused          Code = abi.LookupRefused
	CodeLookupUnavailable      Code = abi.LookupUnavailable
	CodeLookupCancelled        Code = abi.LookupCancelled
)

var codeNames = map[Code]string{
	CodeNotFound:               "NOT_FOUND",
	CodeInvalidArgument:        "INVALID_ARGUMENT",
	CodeOutOfBounds:            "OUT_OF_BOUNDS",
	CodeTooLarge:               "TOO_LARGE",
	CodeNotAllowed:             "NOT_ALLOWED",
	CodeNoResult:               "NO_RESULT",
	CodeBufferTooSmall:         "BUFFER_TOO_SMALL",
	CodeLookupTimeout:          "LOOKUP_TIMEOUT",
	CodeLookupBreakerOpen:      "LOOKUP_BREAKER_OPEN",
	CodeLookupResponseTooLarge: "LOOKUP_RESPONSE_TOO_LARGE",
	CodeLookupRefused:          "LOOKUP_REFUSED",
	CodeLookupUnavailable:      "LOOKUP_UNAVAILABLE",
	CodeLookupCancelled:        "LOOKUP_CANCELLED",
}

// String returns the ABI name of the code, e.g. "TOO_LARGE", or "code(-9)" for a reserved one.
func (c Code) String() string {
	if s, ok := codeNames[c]; ok {
		return s
	}
	return "code(" + strconv.Itoa(int(c)) + ")"
}

// Error is a failed import call. Op names the SDK operation ("get", "put", "lookup", ...).
// Match it against the sentinels with errors.Is, or read Code with errors.As.
type Error struct {
	Op   string
	Code Code
}

func (e *Error) Error() string {
	if e.Op == "" {
		return "clink: " + e.Code.String()
	}
	return "clink: " + e.Op + ": " + e.Code.String()
}

// Is reports whether target is the sentinel for e's code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Op == "" && t.Code == e.Code
}

// Retryable reports whether the same call may succeed later: a lookup that timed out, met an
// open circuit breaker, or could not reach the endpoint. Every other code is permanent for the
// same arguments.
func (e *Error) Retryable() bool {
	switch e.Code {
	case CodeLookupTimeout, CodeLookupBreakerOpen, CodeLookupUnavailable:
		return true
	}
	return false
}

// Sentinels for errors.Is. They are never returned as such: returned errors carry an Op.
var (
	ErrInvalidArgument        = &Error{Code: CodeInvalidArgument}
	ErrOutOfBounds            = &Error{Code: CodeOutOfBounds}
	ErrTooLarge               = &Error{Code: CodeTooLarge}
	ErrNotAllowed             = &Error{Code: CodeNotAllowed}
	ErrNoResult               = &Error{Code: CodeNoResult}
	ErrBufferTooSmall         = &Error{Code: CodeBufferTooSmall}
	ErrLookupTimeout          = &Error{Code: CodeLookupTimeout}
	ErrLookupBreakerOpen      = &Error{Code: CodeLookupBreakerOpen}
	ErrLookupResponseTooLarge = &Error{Code: CodeLookupResponseTooLarge}
	ErrLookupRefused          = &Error{Code: CodeLookupRefused}
	ErrLookupUnavailable      = &Error{Code: CodeLookupUnavailable}
	ErrLookupCancelled        = &Error{Code: CodeLookupCancelled}
)

// codeErr turns a negative result code into an error. It allocates, but only on failure.
func codeErr(op string, rc int64) error {
	return &Error{Op: op, Code: Code(rc)}
}
