package lookup

import (
	"context"
	"errors"
	"strings"
)

// ErrorKind classifies a failed lookup. Each kind maps to one ABI result code (see
// [ErrorKind.ABICode]); the guest decides what to do with it.
type ErrorKind uint8

const (
	// KindNone is the kind of a nil error.
	KindNone ErrorKind = iota
	// KindTimeout: the endpoint's timeout, the queue timeout or the caller's deadline passed.
	KindTimeout
	// KindBreakerOpen: the circuit breaker rejected the request; nothing was sent.
	KindBreakerOpen
	// KindTooLarge: the response body exceeded the endpoint's limit.
	KindTooLarge
	// KindRefused: the endpoint's policy refused the request (method, path, header, malformed
	// request, redirect to another origin, forbidden address). Nothing was sent, or what was
	// sent (a redirect) was not followed.
	KindRefused
	// KindUnavailable: connection failure, reset, unreadable response, local queue full.
	KindUnavailable
	// KindCancelled: the caller's context was cancelled or the endpoint was closed.
	KindCancelled

	numKinds
)

var kindNames = [numKinds]string{"none", "timeout", "breaker_open", "too_large", "refused", "unavailable", "cancelled"}

func (k ErrorKind) String() string {
	if k < numKinds {
		return kindNames[k]
	}
	return "unknown"
}

// ABICode returns the lookup result code of docs/abi.md ("Result codes") for k: -16
// LOOKUP_TIMEOUT, -17 LOOKUP_BREAKER_OPEN, -18 LOOKUP_RESPONSE_TOO_LARGE, -19 LOOKUP_REFUSED,
// -20 LOOKUP_UNAVAILABLE, -21 LOOKUP_CANCELLED, and 0 for KindNone. An unknown kind maps to
// LOOKUP_UNAVAILABLE so that a guest always sees a documented code.
func (k ErrorKind) ABICode() int32 {
	switch k {
	case KindNone:
		return 0
	case KindTimeout:
		return -16
	case KindBreakerOpen:
		return -17
	case KindTooLarge:
		return -18
	case KindRefused:
		return -19
	case KindCancelled:
		return -21
	default:
		return -20
	}
}

// Error is the error type of this package. Every error a [Response] carries is an *Error, so
// [Kind] and errors.As see it; errors.Is(err, ErrTimeout) and friends match by kind.
type Error struct {
	Kind     ErrorKind
	Endpoint string // endpoint name, when known
	Rule     string // for KindRefused: the policy rule that refused the request (Rule… constants)
	Reason   string // short human-readable reason, e.g. "method DELETE not allowed"
	Err      error  // underlying cause, if any

	// notSent is set when the request provably never left this process (policy refusals,
	// dial and DNS failures, a breaker rejection). Only such failures may retry a
	// non-idempotent request.
	notSent bool
}

// Sentinels for errors.Is. They carry no detail; match by kind.
var (
	ErrTimeout     = &Error{Kind: KindTimeout}
	ErrBreakerOpen = &Error{Kind: KindBreakerOpen}
	ErrTooLarge    = &Error{Kind: KindTooLarge}
	ErrRefused     = &Error{Kind: KindRefused}
	ErrUnavailable = &Error{Kind: KindUnavailable}
	ErrCancelled   = &Error{Kind: KindCancelled}
)

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("lookup")
	if e.Endpoint != "" {
		b.WriteString(" ")
		b.WriteString(e.Endpoint)
	}
	b.WriteString(": ")
	b.WriteString(e.Kind.String())
	if e.Rule != "" {
		b.WriteString(" by rule ")
		b.WriteString(e.Rule)
	}
	if e.Reason != "" {
		b.WriteString(": ")
		b.WriteString(e.Reason)
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is an *Error of the same kind, so that the sentinels match.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Kind == e.Kind && t.Rule == "" && t.Reason == "" && t.Err == nil
}

// Retryable reports whether the failure is transient, so that the same request may succeed
// if sent again: timeouts and unavailability. Whether the endpoint does retry also depends on
// its retry policy and on the method's idempotence.
func (e *Error) Retryable() bool { return e.Kind == KindTimeout || e.Kind == KindUnavailable }

// Kind returns the kind of err: KindNone for nil, the kind of the *Error in err's chain, and
// otherwise KindCancelled / KindTimeout for context errors and KindUnavailable for anything
// else.
func Kind(err error) ErrorKind {
	if err == nil {
		return KindNone
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	switch {
	case errors.Is(err, context.Canceled):
		return KindCancelled
	case errors.Is(err, context.DeadlineExceeded):
		return KindTimeout
	}
	return KindUnavailable
}

// IsRetryable reports whether err is a transient lookup failure (see [Error.Retryable]).
func IsRetryable(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Retryable()
}

// The rules that refuse a request (KindRefused), as [Error.Rule] names them, in the log, the
// guest-visible error text and the refusal counters of [Metrics]. Each is named after what
// the user configures or the document that defines it.
const (
	RuleRequestFormat = "request_format" // the guest's bytes are not a request (docs/abi.md, "Lookup request format")
	RuleMethods       = "methods"        // the method is not in the endpoint's methods
	RuleHeaders       = "headers"        // a header the guest may not set (injected, hop-by-hop), or a malformed one
	RulePath          = "path"           // the path escapes the root or is ambiguously encoded
	RulePathPrefix    = "path_prefix"    // the path lies outside the endpoint's path_prefix
	RuleRedirect      = "redirect"       // a redirect to another origin or outside the prefix
	RuleEgress        = "egress"         // the upstream's address is forbidden by the egress policy
)

// rules lists the Rule… constants; a refusal's counter is its index here.
var rules = [...]string{RuleRequestFormat, RuleMethods, RuleHeaders, RulePath, RulePathPrefix, RuleRedirect, RuleEgress}

const numRules = len(rules)

func ruleIndex(rule string) int {
	for i, r := range rules {
		if r == rule {
			return i
		}
	}
	return -1
}

func refused(rule, reason string) *Error {
	return &Error{Kind: KindRefused, Rule: rule, Reason: reason, notSent: true}
}
