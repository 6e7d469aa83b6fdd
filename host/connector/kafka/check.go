package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Check connects to the cluster c describes and makes sure the topics exist and can be
// described. It returns an *Error whose Kind says what is wrong: ErrUnreachable (nothing
// answered within the request timeout), ErrAuthentication, ErrAuthorization or
// ErrMissingTopic, with the topic named.
func Check(ctx context.Context, c Config, topics ...string) error {
	cl, err := c.newClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	_, err = describe(ctx, cl, c, topics)
	return err
}

// describe returns the partition count of each topic, or a classified error.
func describe(ctx context.Context, cl *kgo.Client, c Config, topics []string) (map[string]int32, error) {
	ctx, cancel := context.WithTimeout(ctx, c.requestTimeout())
	defer cancel()
	md, err := kadm.NewClient(cl).Metadata(ctx, topics...)
	if err != nil {
		if errors.Is(classify("metadata", err), ErrAuthorization) {
			err = fmt.Errorf("describing topics %q: %w", topics, err)
		}
		return nil, brokersErr(c, classify("metadata", err))
	}
	out := make(map[string]int32, len(topics))
	for _, t := range topics {
		td, ok := md.Topics[t]
		if !ok {
			return nil, &Error{Op: "metadata", Kind: ErrMissingTopic, Err: fmt.Errorf("topic %q", t)}
		}
		if td.Err != nil {
			e := classify("metadata", td.Err).(*Error)
			e.Err = fmt.Errorf("topic %q: %w", t, e.Err)
			return nil, e
		}
		out[t] = int32(len(td.Partitions))
	}
	return out, nil
}

// matching returns the partition counts of the topics whose names match re (internal topics
// excluded).
func matching(ctx context.Context, cl *kgo.Client, c Config, re *regexp.Regexp) (map[string]int32, error) {
	ctx, cancel := context.WithTimeout(ctx, c.requestTimeout())
	defer cancel()
	md, err := kadm.NewClient(cl).Metadata(ctx)
	if err != nil {
		return nil, brokersErr(c, classify("metadata", err))
	}
	out := map[string]int32{}
	for name, td := range md.Topics {
		if td.IsInternal || !re.MatchString(name) {
			continue
		}
		if td.Err != nil {
			return nil, classify("metadata", fmt.Errorf("topic %q: %w", name, td.Err))
		}
		out[name] = int32(len(td.Partitions))
	}
	if len(out) == 0 {
		return nil, &Error{Op: "metadata", Kind: ErrMissingTopic, Err: fmt.Errorf("no topic matches pattern %q", re)}
	}
	return out, nil
}

// brokersErr adds what a user needs to fix a connection error: the brokers of an unreachable
// cluster, or the likely cause of a connection the broker closed at once. (A real broker
// answers bad credentials with SASL_AUTHENTICATION_FAILED, which classify knows; some, kfake
// among them, just close the connection.)
func brokersErr(c Config, err error) error {
	e, ok := errors.AsType[*Error](err)
	if !ok {
		return err
	}
	_, firstEOF := errors.AsType[*kgo.ErrFirstReadEOF](e.Err)
	switch {
	case e.Kind == nil && c.SASL != nil && (firstEOF || errors.Is(e.Err, io.EOF)):
		e.Kind, e.Retryable = ErrAuthentication, false
		e.Err = fmt.Errorf("the broker closed the connection after SASL %s authentication (wrong credentials or mechanism?): %w",
			c.SASL.Mechanism, e.Err)
	case e.Kind == nil && firstEOF && c.reachedBefore():
		// The cluster answered this process before: a connection closed at once is an
		// outage (a broker going away), not a TLS or SASL mismatch.
		e.Kind, e.Retryable = ErrUnreachable, true
		e.Err = fmt.Errorf("the broker closed the connection at once (it answered before: is it going away?): %w", e.Err)
	case e.Kind == nil && firstEOF:
		e.Kind, e.Retryable = ErrAuthentication, false
		e.Err = fmt.Errorf("the broker closed the connection at once (does it require TLS or SASL?): %w", e.Err)
	case errors.Is(e.Kind, ErrUnreachable):
		e.Err = fmt.Errorf("no answer from %v within %v (is the cluster running? check brokers): %w",
			slices.Clone(c.Brokers), c.requestTimeout(), e.Err)
	}
	return e
}
