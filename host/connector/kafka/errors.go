package kafka

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/twmb/franz-go/pkg/kerr"
)

// Sentinels that errors.Is sees through every *Error this package returns.
var (
	// ErrConfig: the configuration is invalid (a field path says which part). Permanent.
	ErrConfig = errors.New("invalid kafka configuration")
	// ErrUnreachable: no broker answered (refused, timed out, DNS). Retryable.
	ErrUnreachable = errors.New("kafka cluster unreachable")
	// ErrMissingTopic: a configured topic does not exist. Permanent until someone creates it.
	ErrMissingTopic = errors.New("kafka topic does not exist")
	// ErrAuthentication: SASL or TLS authentication was refused. Permanent.
	ErrAuthentication = errors.New("kafka authentication failed")
	// ErrAuthorization: the principal lacks an ACL for a topic, group, transactional ID or
	// the cluster. Permanent.
	ErrAuthorization = errors.New("kafka authorization failed")
	// ErrPositionLost: a restored position lies outside its partition's log (retention
	// deleted the records after it, or the topic was recreated): reading on would skip or
	// invent records. Permanent.
	ErrPositionLost = errors.New("kafka source position is outside the partition's log")
	// ErrFenced: another producer with the same transactional ID took over (a newer
	// instance of this subtask). Permanent for this instance: it must stop.
	ErrFenced = errors.New("kafka producer fenced by a newer instance")
	// ErrTransactionAborted: the cluster refused a write of an epoch's transaction in a way
	// the transactional producer cannot recover from (OUT_OF_ORDER_SEQUENCE_NUMBER), and the
	// sink aborted that transaction: nothing of the epoch is visible to read_committed
	// consumers, and the sink instance is unusable. Retryable: restore from the last
	// checkpoint (Recover, new sinks) and the epoch is written again, exactly once.
	ErrTransactionAborted = errors.New("kafka sink transaction aborted")
	// ErrPartialCommit: some sink transactions of an epoch committed and another can no
	// longer be (it was aborted, typically by the transaction timeout). Neither rolling
	// forward nor back is exact; an operator must look. Permanent.
	ErrPartialCommit = errors.New("kafka epoch partially committed")
	// ErrInvariant: the recovery inputs contradict the protocol (a marker newer than any
	// pending manifest). Permanent.
	ErrInvariant = errors.New("kafka exactly-once invariant violated")
)

// Error is the error type of this package: what was being done, the class (one of the
// sentinels above, or nil for an unclassified Kafka error), whether retrying can help, and
// the underlying cause.
type Error struct {
	Op        string // "connect", "metadata", "produce", "commit", "recover", ...
	Kind      error  // one of the sentinels, or nil
	Retryable bool
	Err       error
}

func (e *Error) Error() string {
	switch {
	case e.Kind != nil && e.Err != nil:
		return fmt.Sprintf("kafka %s: %v: %v", e.Op, e.Kind, e.Err)
	case e.Kind != nil:
		return fmt.Sprintf("kafka %s: %v", e.Op, e.Kind)
	default:
		return fmt.Sprintf("kafka %s: %v", e.Op, e.Err)
	}
}

func (e *Error) Unwrap() []error {
	if e.Kind == nil {
		return []error{e.Err}
	}
	return []error{e.Kind, e.Err}
}

// IsRetryable reports whether err, or an *Error inside it, says retrying may help.
func IsRetryable(err error) bool {
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Retryable
	}
	if ke, ok := errors.AsType[*kerr.Error](err); ok {
		return ke.Retriable
	}
	return false
}

// classify wraps a franz-go error into an *Error with the kind a user can act on. It is the
// one place that knows which Kafka error codes mean what to a user.
func classify(op string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := errors.AsType[*Error](err); ok {
		return err
	}
	e := &Error{Op: op, Err: err}
	var ke *kerr.Error
	switch {
	case errors.As(err, &ke):
		e.Retryable = ke.Retriable
		switch ke.Code {
		case kerr.UnknownTopicOrPartition.Code, kerr.UnknownTopicID.Code:
			e.Kind, e.Retryable = ErrMissingTopic, false
		case kerr.TopicAuthorizationFailed.Code, kerr.GroupAuthorizationFailed.Code,
			kerr.ClusterAuthorizationFailed.Code, kerr.TransactionalIDAuthorizationFailed.Code:
			e.Kind = ErrAuthorization
		case kerr.SaslAuthenticationFailed.Code, kerr.UnsupportedSaslMechanism.Code, kerr.IllegalSaslState.Code:
			e.Kind = ErrAuthentication
		case kerr.ProducerFenced.Code, kerr.InvalidProducerEpoch.Code, kerr.TransactionalIDNotFound.Code:
			e.Kind, e.Retryable = ErrFenced, false
		}
	case isTLSFailure(err):
		e.Kind = ErrAuthentication
	case isUnreachable(err):
		e.Kind, e.Retryable = ErrUnreachable, true
	case errors.Is(err, context.DeadlineExceeded):
		// A request that never got an answer in time: most often the cluster is gone.
		e.Kind, e.Retryable = ErrUnreachable, true
	}
	return e
}

func isUnreachable(err error) bool {
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) {
		return true
	}
	if _, ok := errors.AsType[*net.OpError](err); ok {
		return true
	}
	if _, ok := errors.AsType[*net.DNSError](err); ok {
		return true
	}
	return false
}

// isTLSFailure reports a TLS handshake that failed on certificates or on a peer that does not
// speak TLS: a configuration problem, not an outage.
func isTLSFailure(err error) bool {
	if _, ok := errors.AsType[*tls.CertificateVerificationError](err); ok {
		return true
	}
	if _, ok := errors.AsType[tls.RecordHeaderError](err); ok {
		return true
	}
	if _, ok := errors.AsType[x509.UnknownAuthorityError](err); ok {
		return true
	}
	if _, ok := errors.AsType[x509.HostnameError](err); ok {
		return true
	}
	_, ok := errors.AsType[x509.CertificateInvalidError](err)
	return ok
}
