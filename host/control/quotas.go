package control

import (
	"fmt"
	"regexp"
	"strings"
)

// Quotas bound what one tenant may use. Zero is a real value ("none"), not "default": defaults
// are applied once, when a tenant is created (DefaultQuotas), and a PATCH changes only the
// fields it names.
type Quotas struct {
	MaxPipelines       int   `json:"max_pipelines"`
	MaxSubtasks        int   `json:"max_subtasks"`           // summed over the tenant's pipelines
	GuestMemoryBytes   int64 `json:"guest_memory_bytes"`     // per operator instance
	CPUTimePerRecordMs int64 `json:"cpu_time_per_record_ms"` // guest execution per record
	// GuestCPUMillicores bounds the guest execution time of all the tenant's pipelines together,
	// in thousandths of a core on average (abi.CPUShare). 0 = no bound (tenants created before
	// this quota existed have 0).
	GuestCPUMillicores   int64    `json:"guest_cpu_millicores"`
	MaxInFlightRecords   int      `json:"max_in_flight_records"` // per pipeline
	HotTierBytes         int64    `json:"hot_tier_bytes"`        // per pipeline
	StateBytes           int64    `json:"state_bytes"`           // durable state, per tenant
	LookupRequestsPerSec int      `json:"lookup_requests_per_second"`
	AllowedLookupHosts   []string `json:"allowed_lookup_hosts"`    // host or host:port; "*.example.com" for subdomains
	AllowedKafkaBrokers  []string `json:"allowed_kafka_brokers"`   // the same forms, for Kafka sources and sinks
	APIRequestsPerSec    int      `json:"api_requests_per_second"` // the REST API, per tenant
	MaxModules           int      `json:"max_modules"`
	MaxModuleBytes       int64    `json:"max_module_bytes"`
}

// DefaultQuotas is the one place quota defaults live.
func DefaultQuotas() Quotas {
	return Quotas{
		MaxPipelines:         10,
		MaxSubtasks:          16,
		GuestMemoryBytes:     256 << 20,
		CPUTimePerRecordMs:   1000,
		GuestCPUMillicores:   1000,
		MaxInFlightRecords:   10000,
		HotTierBytes:         256 << 20,
		StateBytes:           10 << 30,
		LookupRequestsPerSec: 100,
		AllowedLookupHosts:   []string{},
		AllowedKafkaBrokers:  []string{},
		APIRequestsPerSec:    50,
		MaxModules:           100,
		MaxModuleBytes:       32 << 20,
	}
}

// QuotaPatch is a partial change of Quotas: nil fields are left as they are.
type QuotaPatch struct {
	MaxPipelines         *int      `json:"max_pipelines"`
	MaxSubtasks          *int      `json:"max_subtasks"`
	GuestMemoryBytes     *int64    `json:"guest_memory_bytes"`
	CPUTimePerRecordMs   *int64    `json:"cpu_time_per_record_ms"`
	GuestCPUMillicores   *int64    `json:"guest_cpu_millicores"`
	MaxInFlightRecords   *int      `json:"max_in_flight_records"`
	HotTierBytes         *int64    `json:"hot_tier_bytes"`
	StateBytes           *int64    `json:"state_bytes"`
	LookupRequestsPerSec *int      `json:"lookup_requests_per_second"`
	AllowedLookupHosts   *[]string `json:"allowed_lookup_hosts"`
	AllowedKafkaBrokers  *[]string `json:"allowed_kafka_brokers"`
	APIRequestsPerSec    *int      `json:"api_requests_per_second"`
	MaxModules           *int      `json:"max_modules"`
	MaxModuleBytes       *int64    `json:"max_module_bytes"`
}

// Apply returns q with p's fields set.
func (p QuotaPatch) Apply(q Quotas) Quotas {
	set := func(dst *int, v *int) {
		if v != nil {
			*dst = *v
		}
	}
	set64 := func(dst *int64, v *int64) {
		if v != nil {
			*dst = *v
		}
	}
	set(&q.MaxPipelines, p.MaxPipelines)
	set(&q.MaxSubtasks, p.MaxSubtasks)
	set64(&q.GuestMemoryBytes, p.GuestMemoryBytes)
	set64(&q.CPUTimePerRecordMs, p.CPUTimePerRecordMs)
	set64(&q.GuestCPUMillicores, p.GuestCPUMillicores)
	set(&q.MaxInFlightRecords, p.MaxInFlightRecords)
	set64(&q.HotTierBytes, p.HotTierBytes)
	set64(&q.StateBytes, p.StateBytes)
	set(&q.LookupRequestsPerSec, p.LookupRequestsPerSec)
	if p.AllowedLookupHosts != nil {
		q.AllowedLookupHosts = append([]string{}, (*p.AllowedLookupHosts)...)
	}
	if p.AllowedKafkaBrokers != nil {
		q.AllowedKafkaBrokers = append([]string{}, (*p.AllowedKafkaBrokers)...)
	}
	set(&q.APIRequestsPerSec, p.APIRequestsPerSec)
	set(&q.MaxModules, p.MaxModules)
	set64(&q.MaxModuleBytes, p.MaxModuleBytes)
	return q
}

// FieldError is a validation error naming the field at fault (a JSON path).
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// Upper bounds that keep a typo from configuring something absurd.
const (
	maxGuestMemory = 4 << 30 // the wasm32 address space
	minGuestMemory = 64 << 10
)

var hostRE = regexp.MustCompile(`^(\*\.)?[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*(:[0-9]{1,5})?$`)

// Validate checks q; the error is a *FieldError whose field is prefix + the quota's JSON name.
func (q Quotas) Validate(prefix string) error {
	nonNeg := []struct {
		name string
		v    int64
	}{
		{"max_pipelines", int64(q.MaxPipelines)}, {"max_subtasks", int64(q.MaxSubtasks)},
		{"cpu_time_per_record_ms", q.CPUTimePerRecordMs}, {"max_in_flight_records", int64(q.MaxInFlightRecords)},
		{"guest_cpu_millicores", q.GuestCPUMillicores},
		{"hot_tier_bytes", q.HotTierBytes}, {"state_bytes", q.StateBytes},
		{"lookup_requests_per_second", int64(q.LookupRequestsPerSec)}, {"api_requests_per_second", int64(q.APIRequestsPerSec)},
		{"max_modules", int64(q.MaxModules)}, {"max_module_bytes", q.MaxModuleBytes},
	}
	for _, f := range nonNeg {
		if f.v < 0 {
			return &FieldError{prefix + f.name, fmt.Sprintf("must not be negative (got %d)", f.v)}
		}
	}
	if q.GuestMemoryBytes < minGuestMemory || q.GuestMemoryBytes > maxGuestMemory {
		return &FieldError{prefix + "guest_memory_bytes", fmt.Sprintf("must be between %d (one page) and %d (4 GiB), got %d", minGuestMemory, maxGuestMemory, q.GuestMemoryBytes)}
	}
	if q.APIRequestsPerSec == 0 {
		return &FieldError{prefix + "api_requests_per_second", "must be at least 1 (a tenant that cannot call the API cannot change anything)"}
	}
	for i, h := range q.AllowedLookupHosts {
		if !hostRE.MatchString(h) || len(h) > 260 {
			return &FieldError{fmt.Sprintf("%sallowed_lookup_hosts[%d]", prefix, i), fmt.Sprintf("%q is not a lower-case host name or host:port (no scheme, no path)", h)}
		}
	}
	for i, h := range q.AllowedKafkaBrokers {
		if !hostRE.MatchString(h) || len(h) > 260 {
			return &FieldError{fmt.Sprintf("%sallowed_kafka_brokers[%d]", prefix, i), fmt.Sprintf("%q is not a lower-case host name or host:port", h)}
		}
	}
	return nil
}

// HostAllowed reports whether host (host or host:port, as in a URL) is among the allowed hosts.
// An entry without a port allows every port; "*.example.com" allows every subdomain of
// example.com (not example.com itself).
func (q Quotas) HostAllowed(hostport string) bool { return hostIn(q.AllowedLookupHosts, hostport) }

// BrokerAllowed reports whether a Kafka broker (host:port) is among the allowed brokers, with
// the rules of HostAllowed.
func (q Quotas) BrokerAllowed(hostport string) bool { return hostIn(q.AllowedKafkaBrokers, hostport) }

func hostIn(allowed []string, hostport string) bool {
	hostport = strings.ToLower(hostport)
	host := hostport
	if i := strings.LastIndexByte(hostport, ':'); i >= 0 && !strings.Contains(hostport[i:], "]") {
		host = hostport[:i]
	}
	for _, a := range allowed {
		target := host
		if strings.Contains(a, ":") {
			target = hostport
		}
		if rest, ok := strings.CutPrefix(a, "*."); ok {
			if strings.HasSuffix(target, "."+rest) {
				return true
			}
			continue
		}
		if target == a {
			return true
		}
	}
	return false
}
