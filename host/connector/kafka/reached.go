package kafka

import (
	"slices"
	"strings"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// reached remembers the clusters (by their seed brokers) that answered a request in this
// process. A broker that closes a new connection at once means a TLS or SASL mismatch when the
// cluster never answered, but an outage when it answered before (brokersErr): the first is
// permanent, the second is retried.
var reached sync.Map // clusterKey -> struct{}

func clusterKey(brokers []string) string {
	b := slices.Clone(brokers)
	slices.Sort(b)
	return strings.Join(b, ",")
}

// reachedHook marks c's cluster reached on the first request that gets a response.
type reachedHook struct {
	key  string
	once sync.Once
}

// OnBrokerE2E implements kgo.HookBrokerE2E.
func (h *reachedHook) OnBrokerE2E(_ kgo.BrokerMetadata, _ int16, e kgo.BrokerE2E) {
	if e.Err() == nil {
		h.once.Do(func() { reached.Store(h.key, struct{}{}) })
	}
}

func (c Config) reachedBefore() bool {
	_, ok := reached.Load(clusterKey(c.Brokers))
	return ok
}
