// Package lookup is the host side of the guest's `lookup` import (docs/abi.md, "lookup",
// "Lookup request format", "Result codes"): named HTTP endpoints that a pipeline declares and
// its operators call, with a retry policy, a circuit breaker shared per tenant, a response
// cache, single-flight, egress safety and an adaptive concurrency limit.
//
//	reg := lookup.NewRegistry()                      // one per host process
//	ep, err := reg.Open("tenant-a", lookup.EndpointConfig{
//		Name: "geo", BaseURL: "https://geo.internal/api", PathPrefix: "/v1",
//		Headers: map[string]string{"Authorization": "Bearer ${env:GEO_TOKEN}"},
//	})
//	req, err := lookup.ParseRequest(guestBytes)      // KindRefused if malformed
//	ep.Do(ctx, req, func(r lookup.Response) { ... }) // returns at once
//
// # Non-blocking
//
// [Endpoint.Do] returns at once and calls done exactly once, always on another goroutine
// (never before Do returns). Nothing waits on a goroutine of its own except the HTTP exchange
// itself: a request over the concurrency limit waits in a FIFO queue (the releasing attempt
// starts it), and a request waiting out a retry backoff is a timer. So a suspended guest call
// holds neither a runner nor a thread; the scheduler posts done's result back to its runner.
//
// # Errors and ABI codes
//
// A response of any status, after retries, is a [Response] with that Status: the guest decides
// what a 404 or a 503 means. Everything else is an *[Error] whose [ErrorKind] maps to one ABI
// code with [ErrorKind.ABICode]: abi.Code(lookup.Kind(err).ABICode()).
//
//	KindTimeout      -16 LOOKUP_TIMEOUT            attempt timeout (after retries), queue timeout, caller deadline
//	KindBreakerOpen  -17 LOOKUP_BREAKER_OPEN       the breaker rejected the first attempt; nothing sent
//	KindTooLarge     -18 LOOKUP_RESPONSE_TOO_LARGE body over max_response_bytes, detected while reading
//	KindRefused      -19 LOOKUP_REFUSED            malformed request, method, header, path escape,
//	                                               redirect to another origin, forbidden address
//	KindUnavailable  -20 LOOKUP_UNAVAILABLE        connect failure, reset, bad response (after retries); queue full
//	KindCancelled    -21 LOOKUP_CANCELLED          caller's context cancelled, endpoint closed
//
// A refusal names the rule that refused it ([Error.Rule]: methods, headers, path,
// path_prefix, redirect, egress, request_format) in its text ("lookup geo: refused by rule
// methods: method DELETE not allowed"), in the refusal counters of [Metrics] and in the
// endpoint's log ([WithLogger]).
//
// Timeouts and unavailability are retryable ([Error.Retryable]); whether a request is retried
// also depends on the policy and on idempotence (see [RetryPolicy]).
//
// # Order of checks
//
// Do applies, in order: policy (method, guest headers, path normalisation), the response
// cache, single-flight, then per attempt the breaker, the limiter, and the HTTP exchange.
// Refusals happen before anything touches the network. See DESIGN.md for the reasoning, the
// lock order and measurements.
//
// # Egress
//
// The guest names a path relative to the endpoint and can reach nothing else: the path is
// normalised and must stay under the root and prefix; redirects to another origin are
// refused; every dialled address is checked after resolution and before connecting
// ([EgressPolicy]); environment proxies are ignored. Loopback, link-local and cloud metadata
// addresses need an explicit allowance.
//
// # Transport
//
// An http:// endpoint talks to its upstream through a lean HTTP/1.1 client by default
// (EndpointConfig.Transport "h1"): each attempt writes its request and reads the response on
// its own goroutine over a pooled keep-alive connection, parsing a well-formed response in one
// pass within limits and anything else exactly as net/http's http.ReadResponse does, and hands
// what it does not implement (Expect, bodies of unknown length) to net/http before sending
// anything. "h2c" speaks HTTP/2 over cleartext with prior knowledge to an upstream that
// accepts it: the requests in flight share a few multiplexed connections, so at high
// concurrency client and upstream make a fraction of the system calls; done runs on a
// connection's reader goroutine and must not block. "std" selects net/http's Transport;
// https always uses it. All dial through the same egress guard. DESIGN.md, "The HTTP
// transport" and "The HTTP/2 transport", has the rules and the measurements.
//
// # Shared state
//
// One circuit breaker serves every endpoint opened through a [Registry] for the same tenant,
// endpoint name, origin and breaker settings, so the pipelines of a tenant trip and recover
// together and tenants never share one. The connection pool, limiter, cache and single-flight
// table belong to the endpoint (one pipeline).
package lookup
