package lookup_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/clink-wasm/clink-wasm/host/lookup"
)

func Example() {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer t0ken" {
			http.Error(w, "unauthorised", http.StatusUnauthorized)
			return
		}
		fmt.Fprintf(w, `{"path":%q,"ip":%q}`, r.URL.Path, r.URL.Query().Get("ip"))
	}))
	defer upstream.Close()

	reg := lookup.NewRegistry()
	ep, err := reg.Open("tenant-a", lookup.EndpointConfig{
		Name:       "geo",
		BaseURL:    upstream.URL + "/api",
		PathPrefix: "/v1",
		Headers:    map[string]string{"Authorization": "Bearer t0ken"}, // or "Bearer ${env:GEO_TOKEN}"
		Egress:     lookup.EgressPolicy{AllowLoopback: true},           // the example server is local
	})
	if err != nil {
		panic(err)
	}
	defer ep.Close()

	lookupSync := func(raw string) lookup.Response {
		req, err := lookup.ParseRequest([]byte(raw))
		if err != nil {
			return lookup.Response{Err: err}
		}
		ch := make(chan lookup.Response, 1)
		ep.Do(context.Background(), req, func(r lookup.Response) { ch <- r })
		return <-ch
	}

	r := lookupSync("GET /v1/geo?ip=1.2.3.4")
	fmt.Println(r.Status, string(r.Body))

	r = lookupSync("GET /v1/../admin")
	fmt.Println(lookup.Kind(r.Err), lookup.Kind(r.Err).ABICode())

	r = lookupSync("GET /v1/geo\nAuthorization: mine\n")
	fmt.Println(lookup.Kind(r.Err), lookup.Kind(r.Err).ABICode())
	// Output:
	// 200 {"path":"/api/v1/geo","ip":"1.2.3.4"}
	// refused -19
	// refused -19
}
