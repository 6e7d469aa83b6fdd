package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/clink-wasm/clink-wasm/host/connector/gen"
	webhook "github.com/clink-wasm/clink-wasm/host/connector/http"
	"github.com/clink-wasm/clink-wasm/host/connector/ingest"
	"github.com/clink-wasm/clink-wasm/host/connector/kafka"
	"github.com/clink-wasm/clink-wasm/host/connector/stdout"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
)

// hostedConnectors are the connector types a hosted pipeline may use: the HTTP ingest source
// over log and the preview sink into previewDir (nil and "" to validate a spec only), the
// generator, the webhook sink, discard, and Kafka sources and sinks under the server's rules
// (kafkaHosted). The file source and sink and stdout are refused by checkSpec before a spec
// gets here (they would reach the server's own files and output).
func (s *Server) hostedConnectors(log *ingest.Log, previewDir string) *pipeline.Connectors {
	c := &pipeline.Connectors{}
	gen.Register(c)
	webhook.Register(c)
	stdout.Register(c, nil)
	ingest.RegisterObserved(c, log, previewDir, s.observeSink)
	kafka.RegisterHosted(c, s.kafkaHosted())
	return c
}

// kafkaHosted is what a tenant's Kafka connectors may use: the brokers of its
// allowed_kafka_brokers quota (read live from the catalog), and SASL credentials only from the
// server's own secrets (Config.KafkaSecrets, per tenant): a spec names a secret
// (sasl.username_env, sasl.password_env), never holds or reaches one of the server's.
func (s *Server) kafkaHosted() kafka.Hosted {
	h := kafka.Hosted{AllowBroker: func(tenant, hostport string) error {
		t, ok := s.ctl.Snapshot().Tenants[tenant]
		if !ok {
			return fmt.Errorf("no tenant %q", tenant)
		}
		if !t.Quotas.BrokerAllowed(hostport) {
			return fmt.Errorf("broker %q is not among tenant %q's allowed_kafka_brokers (%s)", hostport, tenant, orNone(t.Quotas.AllowedKafkaBrokers))
		}
		return nil
	}}
	if s.cfg.KafkaSecrets != nil {
		h.Secret = s.cfg.KafkaSecrets
	}
	return h
}

// runtimeSpec parses a stored spec as the runtime reads it: the pipeline record's name is the
// job name when the spec has none, and the tenant is the record's.
func runtimeSpec(name, tenant string, raw json.RawMessage) (*pipeline.Spec, error) {
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, badField("spec", "%v", err)
	}
	if _, ok := m["name"]; !ok {
		m["name"] = name
	}
	m["tenant"] = tenant
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	spec, err := pipeline.ParseSpec(b)
	if err != nil {
		return nil, specProblem(err)
	}
	return spec, nil
}

// validateRuntimeSpec checks spec the way pipeline.Start will: the whole spec (field paths,
// the graph) and every connector's options.
func (s *Server) validateRuntimeSpec(name, tenant string, raw json.RawMessage) error {
	spec, err := runtimeSpec(name, tenant, raw)
	if err != nil {
		return err
	}
	if err := s.hostedConnectors(nil, "").ValidateConnectors(spec, &pipeline.Env{}); err != nil {
		return specProblem(err)
	}
	return nil
}

// specProblem turns the runtime's spec errors into a 422 naming the first field at fault (under
// "spec."), with every problem listed.
func specProblem(err error) error {
	var se *pipeline.SpecError
	if !errors.As(err, &se) || len(se.Problems) == 0 {
		return problem(http.StatusUnprocessableEntity, CodeInvalidField, "spec", "%v", err)
	}
	field := func(fe *pipeline.FieldError) string {
		if fe.Path == "" {
			return "spec"
		}
		return "spec." + fe.Path
	}
	lines := make([]string, 0, len(se.Problems))
	list := make([]ModuleProblem, 0, len(se.Problems))
	for _, fe := range se.Problems {
		lines = append(lines, fmt.Sprintf("%s: %s", field(fe), fe.Reason))
		list = append(list, ModuleProblem{Source: field(fe), Detail: fe.Reason})
	}
	p := problem(http.StatusUnprocessableEntity, CodeInvalidField, field(se.Problems[0]), "invalid pipeline spec (%d problem%s): %s",
		len(lines), plural(len(lines)), strings.Join(lines, "; "))
	p.Problems = list
	return p
}
