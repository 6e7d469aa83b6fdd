package server

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/clink-wasm/clink-wasm/host/control"
	"github.com/clink-wasm/clink-wasm/host/pipeline"
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
	// lookupThrottled counts lookups the tenant's lookup gate delayed or refused.
	lookupThrottled *prometheus.CounterVec
}

func newMetrics(reg *prometheus.Registry, ctl *control.Control, rt func() *runtime) *metrics {
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
		lookupThrottled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "clink_lookup_throttled_total", Help: "Lookups the tenant's lookup_requests_per_second quota delayed or refused, per tenant and outcome (delayed, refused).",
		}, []string{"tenant", "outcome"}),
	}
	reg.MustRegister(m.requests, m.latency, m.authFailures, m.rateLimited, m.uploads, m.ingested, m.ingestRefused, m.lookupThrottled,
		catalogCollector{ctl}, runCollector{rt},
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

// runCollector reports each run's subtask figures at scrape time, labelled by tenant, pipeline,
// node (source, operator or sink name) and kind. Labels are bounded by the tenant's quotas:
// pipelines and subtasks.
type runCollector struct{ rt func() *runtime }

var (
	runLabels          = []string{"tenant", "pipeline", "node", "kind"}
	descRunRecordsIn   = prometheus.NewDesc("clink_pipeline_records_in_total", "Records read (sources), completed (operators) or written (sinks).", runLabels, nil)
	descRunRecordsOut  = prometheus.NewDesc("clink_pipeline_records_out_total", "Records emitted downstream.", runLabels, nil)
	descRunInFlight    = prometheus.NewDesc("clink_pipeline_in_flight_records", "Records admitted and not finished (operators).", runLabels, nil)
	descRunSuspended   = prometheus.NewDesc("clink_pipeline_suspended_records", "Records suspended at an async import (operators).", runLabels, nil)
	descRunInputDepth  = prometheus.NewDesc("clink_pipeline_input_batches", "Batches waiting at the node's inputs (a backpressure signal).", runLabels, nil)
	descRunCheckpoint  = prometheus.NewDesc("clink_pipeline_checkpoint_duration_seconds", "Duration of the last committed checkpoint.", []string{"tenant", "pipeline"}, nil)
	descRunCheckpointB = prometheus.NewDesc("clink_pipeline_checkpoint_state_bytes", "State bytes of the last committed checkpoint.", []string{"tenant", "pipeline"}, nil)
	descRunIngestLag   = prometheus.NewDesc("clink_pipeline_ingest_lag_bytes", "Ingested bytes the pipeline has not read yet.", []string{"tenant", "pipeline"}, nil)
)

func (runCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRunRecordsIn, descRunRecordsOut, descRunInFlight, descRunSuspended, descRunInputDepth, descRunCheckpoint, descRunCheckpointB, descRunIngestLag} {
		ch <- d
	}
}

func (rc runCollector) Collect(ch chan<- prometheus.Metric) {
	rt := rc.rt()
	if rt == nil {
		return
	}
	rt.mu.Lock()
	runs := make([]*run, 0, len(rt.runs))
	for _, r := range rt.runs {
		if r != nil && r.job != nil && r.running() {
			runs = append(runs, r)
		}
	}
	rt.mu.Unlock()
	for _, r := range runs {
		m := r.job.Metrics()
		type agg struct{ in, out, inflight, susp, depth float64 }
		sums := map[[2]string]*agg{}
		var order [][2]string
		add := func(kind string, list []pipeline.SubtaskMetrics) {
			for _, sm := range list {
				k := [2]string{sm.Node, kind}
				a := sums[k]
				if a == nil {
					a = &agg{}
					sums[k] = a
					order = append(order, k)
				}
				a.in += float64(sm.RecordsIn)
				a.out += float64(sm.RecordsOut)
				a.inflight += float64(sm.InFlight)
				a.susp += float64(sm.Suspended)
				a.depth += float64(sm.InputDepth)
			}
		}
		add("source", m.Sources)
		add("operator", m.Operators)
		add("sink", m.Sinks)
		for _, k := range order {
			a := sums[k]
			lv := []string{r.tenant, r.id, k[0], k[1]}
			ch <- prometheus.MustNewConstMetric(descRunRecordsIn, prometheus.CounterValue, a.in, lv...)
			ch <- prometheus.MustNewConstMetric(descRunRecordsOut, prometheus.CounterValue, a.out, lv...)
			ch <- prometheus.MustNewConstMetric(descRunInputDepth, prometheus.GaugeValue, a.depth, lv...)
			if k[1] == "operator" {
				ch <- prometheus.MustNewConstMetric(descRunInFlight, prometheus.GaugeValue, a.inflight, lv...)
				ch <- prometheus.MustNewConstMetric(descRunSuspended, prometheus.GaugeValue, a.susp, lv...)
			}
		}
		if cp := m.LastCheckpoint; cp != nil {
			ch <- prometheus.MustNewConstMetric(descRunCheckpoint, prometheus.GaugeValue, cp.Duration.Seconds(), r.tenant, r.id)
			ch <- prometheus.MustNewConstMetric(descRunCheckpointB, prometheus.GaugeValue, float64(cp.StateBytes), r.tenant, r.id)
		}
		ch <- prometheus.MustNewConstMetric(descRunIngestLag, prometheus.GaugeValue, float64(r.log.Lag()), r.tenant, r.id)
	}
}
