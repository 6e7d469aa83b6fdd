package server

import "testing"

// TestDetailViews: …/metrics carries the operator graph (nodes and edges from the spec), the
// run's hot tier and the pipeline's breakers.
func TestDetailViews(t *testing.T) {
	e := newEnv(t)
	tok := e.tenant("acme", map[string]any{"api_requests_per_second": 1000000})
	if r := e.upload(tok, "?name=counter", fixture(t, "counter.wasm")); r.code != 201 {
		t.Fatalf("upload: %d %s", r.code, r.body)
	}
	p := e.startPipeline(tok, "clicks", runtimeSpecFor("counter"))
	base := "/api/v1/pipelines/" + p.ID
	e.ingest(tok, p.ID, records(3, 2, 0))
	waitFor(t, "6 outputs", func() bool { return len(outputLines(e, tok, p.ID)) >= 6 })
	var m struct {
		Graph    Graph     `json:"graph"`
		HotTier  *HotTier  `json:"hot_tier"`
		Breakers []any     `json:"breakers"`
		CPU      *struct{} `json:"cpu"`
	}
	e.do("GET", base+"/metrics", tok, "", nil).decode(t, &m)
	kinds := map[string]string{}
	for _, n := range m.Graph.Nodes {
		kinds[n.Name] = n.Kind
	}
	if len(m.Graph.Nodes) != 3 || kinds["in"] != "source" || kinds["count"] != "operator" || kinds["out"] != "sink" {
		t.Fatalf("graph nodes: %+v", m.Graph.Nodes)
	}
	if len(m.Graph.Edges) != 2 || m.Graph.Edges[0] != (GraphEdge{From: "in", To: "count"}) || m.Graph.Edges[1] != (GraphEdge{From: "count", To: "out"}) {
		t.Fatalf("graph edges: %+v", m.Graph.Edges)
	}
	if m.HotTier == nil || m.HotTier.Hits+m.HotTier.Misses == 0 {
		t.Fatalf("hot tier: %+v", m.HotTier)
	}
	if m.Breakers == nil || len(m.Breakers) != 0 || m.CPU == nil {
		t.Fatalf("breakers %v (want an empty list: no endpoints), cpu %v", m.Breakers, m.CPU)
	}
}
