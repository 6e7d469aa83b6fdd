package server

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/clink-wasm/clink-wasm/host/control"
)

// metrics are the API's own families. Labels are bounded: route is the route template (never a
// raw path), tenant comes only from a valid token (tenants are created by the admin), reason is
// one of a fixed few.
type metrics struct {
	requests      *prometheus.CounterVec
	latency       *prometheus.HistogramVec
	authFailures  *prometheus.CounterVec
	rateLimited   *prometheus.CounterVec
	uploads       *prometheus.CounterVec
	ingested      *prometheus.CounterVec
	ingestRefused *prometheus.CounterVec
}

func newMetrics(reg *prometheus.Registry, ctl *control.Control) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "clink_http_requests_total", Help: "API requests by method, route template and status code.",
		}, []string{"method", "route", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "clink_http_request_duration_seconds", Help: "API request latency by method and route template.",
			Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 30},
		}, []string{"method", "route"}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "clink_http_auth_failures_total", Help: "Requests refused for a missing, malformed or unknown token.",
		}, []string{"reason"}),
		rateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "clink_tenant_api_rate_limited_total", Help: "API requests refused by a tenant's rate limit.",
		}, []string{"tenant"}),
		uploads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "clink_module_uploads_total", Help: "Module uploads by result (registered, existing, invalid, too_large).",
		}, []string{"result"}),
		ingested: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "clink_ingest_records_total", Help: "Records made durable by POST /api/v1/pipelines/{id}/records, per tenant.",
		}, []string{"tenant"}),
		ingestRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "clink_ingest_refused_total", Help: "Ingest requests refused, per tenant and reason (backpressure).",
		}, []string{"tenant", "reason"}),
	}
	reg.MustRegister(m.requests, m.latency, m.authFailures, m.rateLimited, m.uploads, m.ingested, m.ingestRefused,
		catalogCollector{ctl},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{Namespace: "clink"}))
	return m
}

// catalogCollector reports the catalog's record counts at scrape time.
type catalogCollector struct{ ctl *control.Control }

var (
	descTenants   = prometheus.NewDesc("clink_tenants", "Tenants in the catalog.", nil, nil)
	descModules   = prometheus.NewDesc("clink_tenant_modules", "Registered modules per tenant.", []string{"tenant"}, nil)
	descPipelines = prometheus.NewDesc("clink_tenant_pipelines", "Pipeline records per tenant.", []string{"tenant"}, nil)
	descModBytes  = prometheus.NewDesc("clink_tenant_module_bytes", "Bytes of registered modules per tenant.", []string{"tenant"}, nil)
)

func (catalogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descTenants
	ch <- descModules
	ch <- descPipelines
	ch <- descModBytes
}

func (cc catalogCollector) Collect(ch chan<- prometheus.Metric) {
	cat := cc.ctl.Snapshot()
	ch <- prometheus.MustNewConstMetric(descTenants, prometheus.GaugeValue, float64(len(cat.Tenants)))
	for name := range cat.Tenants {
		var n, bytes int
		for _, m := range cat.TenantModules(name) {
			n++
			bytes += int(m.Size)
		}
		ch <- prometheus.MustNewConstMetric(descModules, prometheus.GaugeValue, float64(n), name)
		ch <- prometheus.MustNewConstMetric(descModBytes, prometheus.GaugeValue, float64(bytes), name)
		ch <- prometheus.MustNewConstMetric(descPipelines, prometheus.GaugeValue, float64(len(cat.TenantPipelines(name))), name)
	}
}
