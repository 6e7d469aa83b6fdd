package server

import (
	"slices"
	"strings"

	"github.com/clink-wasm/clink-wasm/host/control"
	"github.com/clink-wasm/clink-wasm/host/lookup"
)

// The pipeline detail's extra views (GET …/metrics): the operator graph from the spec, the
// run's hot tier, the tenant's lookup breakers of the pipeline's endpoints, and its CPU share.

// GraphNode is one node of a pipeline's graph.
type GraphNode struct {
	Name        string   `json:"name"`
	Kind        string   `json:"kind"` // source, operator, sink
	Type        string   `json:"type,omitempty"`
	Module      string   `json:"module,omitempty"`
	Parallelism int      `json:"parallelism"`
	Endpoints   []string `json:"endpoints,omitempty"`
}

// GraphEdge is one input of a node: from a node (or its side output, "NAME.late") to it.
type GraphEdge struct {
	From string `json:"from"`
	To   string `json:"to"`
	Side string `json:"side,omitempty"`
}

// Graph is a pipeline's operator graph.
type Graph struct {
	Nodes []GraphNode `json:"nodes"`
	Edges []GraphEdge `json:"edges"`
}

// HotTier is the run's hot tier now.
type HotTier struct {
	HitRatio  float64 `json:"hit_ratio"`
	Hits      int64   `json:"hits"`
	Misses    int64   `json:"misses"`
	HotBytes  int64   `json:"hot_bytes"`
	HotLimit  int64   `json:"hot_limit"`
	Evictions int64   `json:"evictions"`
}

func graphOf(p *control.Pipeline) (*Graph, []string) {
	spec, err := runtimeSpec(p.Name, p.Tenant, p.Spec)
	if err != nil {
		return nil, nil
	}
	spec.ApplyDefaults()
	g := &Graph{Nodes: []GraphNode{}, Edges: []GraphEdge{}}
	var endpoints []string
	edges := func(to string, inputs []string) {
		for _, in := range inputs {
			from, side, _ := strings.Cut(in, ".")
			g.Edges = append(g.Edges, GraphEdge{From: from, To: to, Side: side})
		}
	}
	for _, s := range spec.Sources {
		g.Nodes = append(g.Nodes, GraphNode{Name: s.Name, Kind: "source", Type: s.Type, Parallelism: max(1, s.Parallelism)})
	}
	for _, o := range spec.Operators {
		n := GraphNode{Name: o.Name, Kind: "operator", Module: o.Module, Parallelism: max(1, o.Parallelism)}
		for _, ep := range o.Endpoints {
			n.Endpoints = append(n.Endpoints, ep.Name)
			if !slices.Contains(endpoints, ep.Name) {
				endpoints = append(endpoints, ep.Name)
			}
		}
		g.Nodes = append(g.Nodes, n)
		edges(o.Name, o.Inputs)
	}
	for _, s := range spec.Sinks {
		g.Nodes = append(g.Nodes, GraphNode{Name: s.Name, Kind: "sink", Type: s.Type, Parallelism: max(1, s.Parallelism)})
		edges(s.Name, s.Inputs)
	}
	return g, endpoints
}

// detailViews adds the graph, hot tier, breakers and CPU share of pipeline p to out.
func (s *Server) detailViews(p *control.Pipeline, r *run, out map[string]any) {
	g, endpoints := graphOf(p)
	if g != nil {
		out["graph"] = g
	}
	breakers := []lookup.BreakerStatus{}
	for _, b := range s.rt.lookups.Breakers(p.Tenant) {
		if slices.Contains(endpoints, b.Endpoint) {
			breakers = append(breakers, b)
		}
	}
	out["breakers"] = breakers
	if r != nil && r.store != nil {
		m := r.store.Metrics()
		out["hot_tier"] = HotTier{HitRatio: m.HitRatio, Hits: m.Hits, Misses: m.Misses, HotBytes: m.HotBytes, HotLimit: m.HotLimit, Evictions: m.Evictions}
	}
	s.rt.mu.Lock()
	sh := s.rt.shares[p.Tenant]
	quota, capacity := s.rt.shareQuota[p.Tenant], s.rt.capacity
	s.rt.mu.Unlock()
	if sh != nil {
		out["cpu"] = map[string]any{"cores": sh.Cores(), "quota_cores": float64(quota) / 1000, "host_capacity": capacity,
			"guest_seconds": sh.Used().Seconds(), "paused_seconds": sh.Paused().Seconds()}
	}
}
