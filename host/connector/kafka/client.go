package kafka

import "github.com/twmb/franz-go/pkg/kgo"

// NewClient returns a franz-go client for the cluster c names (brokers, client ID, SASL with
// the password from the environment, TLS), with extra options after those: the scale-out
// worker's consumer-group member is built with it.
func (c Config) NewClient(extra ...kgo.Opt) (*kgo.Client, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c.newClient(extra...)
}
