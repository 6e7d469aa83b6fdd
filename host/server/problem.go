package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"
)

// Problem is the one error shape of the API: RFC 9457 problem details (application/problem+json)
// with two extensions every client can rely on: Code, a stable machine-readable name, and Field,
// the request field at fault (a JSON path, a query parameter or a header) where there is one.
type Problem struct {
	Type     string          `json:"type"`
	Title    string          `json:"title"`
	Status   int             `json:"status"`
	Detail   string          `json:"detail,omitempty"`
	Instance string          `json:"instance,omitempty"`
	Code     string          `json:"code"`
	Field    string          `json:"field,omitempty"`
	Problems []ModuleProblem `json:"problems,omitempty"` // every problem of an invalid module

	retryAfter int // seconds; sets Retry-After
}

// ModuleProblem is one reason a module was refused.
type ModuleProblem struct {
	Source string `json:"source"` // "abi" (the module itself) or "quota" (the tenant's limits)
	Detail string `json:"detail"`
}

func (p *Problem) Error() string {
	if p.Field != "" {
		return fmt.Sprintf("%d %s: %s: %s", p.Status, p.Code, p.Field, p.Detail)
	}
	return fmt.Sprintf("%d %s: %s", p.Status, p.Code, p.Detail)
}

// Stable problem codes. Clients may switch on them; they never change meaning.
const (
	CodeUnauthenticated  = "unauthenticated"
	CodeForbidden        = "forbidden"
	CodeNotFound         = "not_found"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeMalformedJSON    = "malformed_json"
	CodeInvalidField     = "invalid_field"
	CodeUnsupportedMedia = "unsupported_media_type"
	CodeTooLarge         = "payload_too_large"
	CodeModuleInvalid    = "module_invalid"
	CodeQuotaExceeded    = "quota_exceeded"
	// CodeCPUOvercommitted refuses a start or a quota raise that would promise the tenants
	// running pipelines more guest CPU than the host's budget (cpubudget.go).
	CodeCPUOvercommitted   = "cpu_overcommitted"
	CodeConflict           = "conflict"
	CodeInUse              = "in_use"
	CodeRateLimited        = "rate_limited"
	CodeRuntimeUnavailable = "runtime_unavailable"
	CodeUnavailable        = "unavailable"
	CodeInternal           = "internal"
)

var titles = map[string]string{
	CodeUnauthenticated:    "Authentication required",
	CodeForbidden:          "Forbidden",
	CodeNotFound:           "Not found",
	CodeMethodNotAllowed:   "Method not allowed",
	CodeMalformedJSON:      "Malformed JSON",
	CodeInvalidField:       "Invalid field",
	CodeUnsupportedMedia:   "Unsupported media type",
	CodeTooLarge:           "Payload too large",
	CodeModuleInvalid:      "Module refused",
	CodeQuotaExceeded:      "Quota exceeded",
	CodeCPUOvercommitted:   "Host CPU overcommitted",
	CodeConflict:           "Conflict",
	CodeInUse:              "In use",
	CodeRateLimited:        "Too many requests",
	CodeRuntimeUnavailable: "Pipeline runtime not available",
	CodeIncompatibleState:  "Incompatible state",
	CodeUnavailable:        "Service unavailable",
	CodeInternal:           "Internal error",
}

func problem(status int, code, field, format string, args ...any) *Problem {
	return &Problem{
		Type: "urn:clink:problem:" + code, Title: titles[code], Status: status,
		Detail: fmt.Sprintf(format, args...), Code: code, Field: field,
	}
}

func badField(field, format string, args ...any) *Problem {
	return problem(http.StatusBadRequest, CodeInvalidField, field, format, args...)
}

func notFound(what, id string) *Problem {
	return problem(http.StatusNotFound, CodeNotFound, "", "%s %q does not exist (or belongs to another tenant)", what, id)
}

// errorHandler renders every error as a Problem. Errors that are not Problems are echo's own
// (no route, wrong method, body limit) or bugs, which are logged and shown without detail.
func (s *Server) errorHandler(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var p *Problem
	var he *echo.HTTPError
	switch {
	case errors.As(err, &p):
	case errors.As(err, &he):
		switch he.Code {
		case http.StatusNotFound:
			p = problem(he.Code, CodeNotFound, "", "no such route: %s %s", c.Request().Method, c.Request().URL.Path)
		case http.StatusMethodNotAllowed:
			p = problem(he.Code, CodeMethodNotAllowed, "", "%s is not allowed on %s", c.Request().Method, c.Request().URL.Path)
		case http.StatusRequestEntityTooLarge:
			p = problem(he.Code, CodeTooLarge, "body", "the request body is larger than allowed")
		case http.StatusUnauthorized:
			p = problem(he.Code, CodeUnauthenticated, "Authorization", "%v", he.Message)
		default:
			p = problem(he.Code, CodeInternal, "", "%v", he.Message)
		}
	default:
		s.log.ErrorContext(c.Request().Context(), "request failed", "method", c.Request().Method, "route", c.Path(), "err", err)
		p = problem(http.StatusInternalServerError, CodeInternal, "", "internal error; the server log has the details (request id %s)", c.Response().Header().Get(echo.HeaderXRequestID))
	}
	if p.Instance == "" {
		p.Instance = c.Request().URL.Path
	}
	h := c.Response().Header()
	if p.retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(p.retryAfter))
	}
	if p.Status == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", `Bearer realm="clink"`)
	}
	h.Set(echo.HeaderContentType, "application/problem+json")
	c.Response().WriteHeader(p.Status)
	if c.Request().Method == http.MethodHead {
		return
	}
	_ = json.NewEncoder(c.Response()).Encode(p)
}

// maxJSONBody bounds a JSON request body.
const maxJSONBody = 1 << 20

// decodeJSON decodes the request body into dst, refusing unknown fields and trailing data. Its
// errors are Problems that name the field at fault.
func decodeJSON(c echo.Context, dst any) error {
	r := c.Request()
	if ct := r.Header.Get(echo.HeaderContentType); ct != "" && !strings.HasPrefix(ct, echo.MIMEApplicationJSON) && !strings.HasPrefix(ct, "application/merge-patch+json") {
		return problem(http.StatusUnsupportedMediaType, CodeUnsupportedMedia, "Content-Type", "send the body as application/json, not %s", ct)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxJSONBody+1))
	if err != nil {
		return problem(http.StatusBadRequest, CodeMalformedJSON, "body", "reading the body: %v", err)
	}
	if len(body) > maxJSONBody {
		return problem(http.StatusRequestEntityTooLarge, CodeTooLarge, "body", "a JSON body may be at most %d bytes", maxJSONBody)
	}
	return decodeJSONBytes(body, dst)
}

func decodeJSONBytes(body []byte, dst any) error {
	if len(strings.TrimSpace(string(body))) == 0 {
		return problem(http.StatusBadRequest, CodeMalformedJSON, "body", "the body is empty; send a JSON object")
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	err := dec.Decode(dst)
	if err == nil && dec.More() {
		return problem(http.StatusBadRequest, CodeMalformedJSON, "body", "trailing data after the JSON object")
	}
	if err == nil {
		return nil
	}
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return problem(http.StatusBadRequest, CodeMalformedJSON, "body", "malformed JSON at byte %d: %v", se.Offset, se)
	case errors.As(err, &te):
		field := te.Field
		if field == "" {
			field = "body"
		}
		return problem(http.StatusBadRequest, CodeMalformedJSON, field, "%s must be %s, not a JSON %s", field, jsonKind(te.Type.String()), te.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return problem(http.StatusBadRequest, CodeMalformedJSON, "body", "the JSON body ends early")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		field := name
		if field == "" {
			field = "body"
		}
		return problem(http.StatusBadRequest, CodeInvalidField, field, "unknown field %q", name)
	default:
		return problem(http.StatusBadRequest, CodeMalformedJSON, "body", "%v", err)
	}
}

func jsonKind(goType string) string {
	switch {
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "uint"), strings.HasPrefix(goType, "*int"):
		return "an integer"
	case strings.HasPrefix(goType, "float"):
		return "a number"
	case goType == "string", goType == "*string":
		return "a string"
	case goType == "bool", goType == "*bool":
		return "a boolean"
	case strings.HasPrefix(goType, "[]"), strings.HasPrefix(goType, "*[]"):
		return "an array"
	default:
		return "an object"
	}
}
