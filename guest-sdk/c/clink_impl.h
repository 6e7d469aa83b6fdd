/*
 * clink_impl.h: the definitions behind clink.h and the module's exports. Included by clink.h
 * unless CLINK_DECLARATIONS_ONLY is defined; do not include it directly.
 */
#ifndef CLINK_IMPL_H
#define CLINK_IMPL_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- The clink_v1 imports (docs/abi.md, "Imports") ---- */

#define CLINK__IMPORT(n) __attribute__((import_module("clink_v1"), import_name(#n)))
CLINK__IMPORT(get_async) int32_t clink__get_async(uint32_t, const void *, uint32_t, void *, uint32_t);
CLINK__IMPORT(put) int32_t clink__put(uint32_t, const void *, uint32_t, const void *, uint32_t);
CLINK__IMPORT(delete) int32_t clink__delete(uint32_t, const void *, uint32_t);
CLINK__IMPORT(take_result) int32_t clink__take_result(void *, uint32_t);
CLINK__IMPORT(emit) int32_t clink__emit(const void *, uint32_t, const void *, uint32_t);
CLINK__IMPORT(timer_register) int32_t clink__timer_register(int64_t);
CLINK__IMPORT(timer_delete) int32_t clink__timer_delete(int64_t);
CLINK__IMPORT(watermark) int64_t clink__watermark(void);
CLINK__IMPORT(processing_time) int64_t clink__processing_time(void);
CLINK__IMPORT(log) void clink__log(int32_t, const void *, uint32_t);
CLINK__IMPORT(lookup) int64_t clink__lookup(uint32_t, const void *, uint32_t, void *, uint32_t);
CLINK__IMPORT(set_resume_order) void clink__set_resume_order(int64_t);
CLINK__IMPORT(output_area) int32_t clink__output_area(void *, uint32_t);
CLINK__IMPORT(flush_output) int32_t clink__flush_output(void);

/* ---- Fast-path layout (docs/abi.md, "Fast paths") ---- */

#define CLINK__FRAME_HEADER 16u
#define CLINK__FRAME_ABSENT 0xFFFFFFFFu
#define CLINK__FRAME_TOO_LARGE 0xFFFFFFFEu
#define CLINK__FRAME_DIRTY 1u
#define CLINK__FRAME_MIN_CAP 64u
#define CLINK__MAX_STATES 256
#define CLINK__MAX_PREFETCH 16
#define CLINK__MAX_ENDPOINTS 64
/* The output area: 16 KiB, a quarter of a page-sized instance's first page. */
#define CLINK__AREA_SIZE 16384u
#define CLINK__MAX_INPUT (1u << 30)

struct clink_state {
	const char *name;
	uint32_t index;
	int prefetch;
	/* Offset of the state's frame header in the input buffer during process and on_timer,
	 * -1 outside them. INVARIANT: >= 0 only while the frame belongs to the current call. */
	int64_t frame;
	/* The entry was written with the put import (a value larger than the frame): reads go
	 * through get_async until the next write to the frame. */
	int stale;
};

struct clink_endpoint {
	const char *name;
	uint32_t index;
};

static struct {
	const char *name;
	const clink_operator *op;
	int sealed;
	struct clink_state states[CLINK__MAX_STATES];
	uint32_t n_states;
	struct clink_state *prefetched[CLINK__MAX_PREFETCH];
	uint32_t n_prefetched;
	struct clink_endpoint endpoints[CLINK__MAX_ENDPOINTS];
	uint32_t n_endpoints;
	clink_buf manifest;
	uint8_t *input;
	uint32_t input_cap;
	clink_buf result;  /* shared by state reads and lookups */
	clink_buf request; /* the lookup request being built */
	clink_buf log;     /* clink_logf */
	/* 0 before the first emit, 1 once the area is registered, -1 when the host refused it. */
	int area_state;
	int emitting; /* in process, on_timer or close: the calls whose return drains the area */
	int logged_error; /* the operator logged at error level during the current call */
} clink__g;

static uint32_t clink__area_words[CLINK__AREA_SIZE / 4];
#define clink__area ((uint8_t *)clink__area_words)

static inline uint32_t clink__le32(const uint8_t *b) {
	return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static inline void clink__put_le32(uint8_t *b, uint32_t v) {
	b[0] = (uint8_t)v;
	b[1] = (uint8_t)(v >> 8);
	b[2] = (uint8_t)(v >> 16);
	b[3] = (uint8_t)(v >> 24);
}

/* ---- Logging and codes ---- */

void clink_log(int level, const void *msg, uint32_t len) {
	if (level >= CLINK_ERROR)
		clink__g.logged_error = 1;
	clink__log(level, msg, len);
}

void clink_log_str(int level, const char *msg) { clink_log(level, msg, (uint32_t)strlen(msg)); }

void clink_logf(int level, const char *format, ...) {
	va_list ap;
	va_start(ap, format);
	char small[256];
	int n = vsnprintf(small, sizeof small, format, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n < sizeof small) {
		clink_log(level, small, (uint32_t)n);
		return;
	}
	/* Longer than the stack buffer: format again into the SDK's log buffer. */
	clink_buf *b = &clink__g.log;
	if (b->cap < (uint32_t)n + 1) {
		uint8_t *p = (uint8_t *)realloc(b->data, (size_t)n + 1);
		if (p == NULL) {
			clink_log(level, small, sizeof small - 1); /* truncated rather than lost */
			return;
		}
		b->data = p;
		b->cap = (uint32_t)n + 1;
	}
	va_start(ap, format);
	vsnprintf((char *)b->data, (size_t)n + 1, format, ap);
	va_end(ap);
	clink_log(level, b->data, (uint32_t)n);
	if (b->cap > (64u << 10))
		clink_buf_free(b); /* do not pin a huge buffer after one large message */
}

const char *clink_code_name(int32_t code) {
	switch (code) {
	case CLINK_NOT_FOUND: return "NOT_FOUND";
	case CLINK_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
	case CLINK_OUT_OF_BOUNDS: return "OUT_OF_BOUNDS";
	case CLINK_TOO_LARGE: return "TOO_LARGE";
	case CLINK_NOT_ALLOWED: return "NOT_ALLOWED";
	case CLINK_NO_RESULT: return "NO_RESULT";
	case CLINK_BUFFER_TOO_SMALL: return "BUFFER_TOO_SMALL";
	case CLINK_LOOKUP_TIMEOUT: return "LOOKUP_TIMEOUT";
	case CLINK_LOOKUP_BREAKER_OPEN: return "LOOKUP_BREAKER_OPEN";
	case CLINK_LOOKUP_RESPONSE_TOO_LARGE: return "LOOKUP_RESPONSE_TOO_LARGE";
	case CLINK_LOOKUP_REFUSED: return "LOOKUP_REFUSED";
	case CLINK_LOOKUP_UNAVAILABLE: return "LOOKUP_UNAVAILABLE";
	case CLINK_LOOKUP_CANCELLED: return "LOOKUP_CANCELLED";
	}
	return code >= 0 ? "OK" : "UNKNOWN";
}

int clink_retryable(int32_t code) {
	return code == CLINK_LOOKUP_TIMEOUT || code == CLINK_LOOKUP_BREAKER_OPEN ||
	       code == CLINK_LOOKUP_UNAVAILABLE;
}

/* clink__die logs msg at error level and traps: a misuse the module cannot recover from (an
 * invalid declaration). The host fails the load or the call with msg. */
__attribute__((noreturn)) static void clink__die(const char *msg) {
	clink_log_str(CLINK_ERROR, msg);
	__builtin_trap();
}

/* ---- Buffers ---- */

static void clink__grow(clink_buf *b, uint32_t extra) {
	if ((uint64_t)b->len + extra <= b->cap)
		return;
	uint64_t want = (uint64_t)b->len + extra;
	uint64_t c = b->cap ? b->cap : 64;
	while (c < want)
		c *= 2;
	if (c > 0x7FFFFFFFu) {
		if (want > 0x7FFFFFFFu)
			clink__die("clink: buffer over 2 GiB");
		c = want;
	}
	uint8_t *p = (uint8_t *)realloc(b->data, (size_t)c);
	if (p == NULL)
		clink__die("clink: out of memory");
	b->data = p;
	b->cap = (uint32_t)c;
}

void clink_buf_reset(clink_buf *b) { b->len = 0; }

void clink_buf_free(clink_buf *b) {
	free(b->data);
	b->data = NULL;
	b->len = b->cap = 0;
}

void clink_buf_append(clink_buf *b, const void *p, uint32_t n) {
	clink__grow(b, n);
	if (n)
		memcpy(b->data + b->len, p, n);
	b->len += n;
}

void clink_buf_append_str(clink_buf *b, const char *s) { clink_buf_append(b, s, (uint32_t)strlen(s)); }

void clink_buf_append_byte(clink_buf *b, uint8_t c) {
	clink__grow(b, 1);
	b->data[b->len++] = c;
}

void clink_buf_append_i64(clink_buf *b, int64_t v) {
	char tmp[20];
	int i = 20;
	/* Work on the negative value: its range includes INT64_MIN. */
	int64_t n = v < 0 ? v : -v;
	do {
		tmp[--i] = (char)('0' - n % 10);
		n /= 10;
	} while (n != 0);
	if (v < 0)
		clink_buf_append_byte(b, '-');
	clink_buf_append(b, tmp + i, (uint32_t)(20 - i));
}

void clink_buf_json_string(clink_buf *b, const void *sv, uint32_t n) {
	static const char hex[] = "0123456789abcdef";
	const uint8_t *s = (const uint8_t *)sv;
	clink_buf_append_byte(b, '"');
	uint32_t start = 0;
	for (uint32_t i = 0; i < n; i++) {
		uint8_t c = s[i];
		if (c >= 0x20 && c != '"' && c != '\\')
			continue;
		clink_buf_append(b, s + start, i - start);
		char esc[6] = {'\\', 0, 0, 0, 0, 0};
		uint32_t el = 2;
		switch (c) {
		case '"': case '\\': esc[1] = (char)c; break;
		case '\b': esc[1] = 'b'; break;
		case '\t': esc[1] = 't'; break;
		case '\n': esc[1] = 'n'; break;
		case '\f': esc[1] = 'f'; break;
		case '\r': esc[1] = 'r'; break;
		default:
			esc[1] = 'u'; esc[2] = '0'; esc[3] = '0';
			esc[4] = hex[c >> 4]; esc[5] = hex[c & 15];
			el = 6;
		}
		clink_buf_append(b, esc, el);
		start = i + 1;
	}
	clink_buf_append(b, s + start, n - start);
	clink_buf_append_byte(b, '"');
}

static int clink__hex4(const uint8_t *s, uint32_t n, uint32_t i, uint32_t *r) {
	if ((uint64_t)i + 4 > n)
		return 0;
	uint32_t v = 0;
	for (uint32_t j = i; j < i + 4; j++) {
		uint8_t c = s[j];
		if (c >= '0' && c <= '9') c -= '0';
		else if (c >= 'a' && c <= 'f') c -= 'a' - 10;
		else if (c >= 'A' && c <= 'F') c -= 'A' - 10;
		else return 0;
		v = v << 4 | c;
	}
	*r = v;
	return 1;
}

static void clink__append_rune(clink_buf *b, uint32_t r) {
	uint8_t u[4];
	uint32_t n;
	if (r < 0x80) { u[0] = (uint8_t)r; n = 1; }
	else if (r < 0x800) { u[0] = (uint8_t)(0xC0 | r >> 6); u[1] = (uint8_t)(0x80 | (r & 0x3F)); n = 2; }
	else if (r < 0x10000) {
		u[0] = (uint8_t)(0xE0 | r >> 12); u[1] = (uint8_t)(0x80 | (r >> 6 & 0x3F));
		u[2] = (uint8_t)(0x80 | (r & 0x3F)); n = 3;
	} else {
		u[0] = (uint8_t)(0xF0 | r >> 18); u[1] = (uint8_t)(0x80 | (r >> 12 & 0x3F));
		u[2] = (uint8_t)(0x80 | (r >> 6 & 0x3F)); u[3] = (uint8_t)(0x80 | (r & 0x3F)); n = 4;
	}
	clink_buf_append(b, u, n);
}

int clink_buf_json_unquote(clink_buf *b, const uint8_t *raw, uint32_t len) {
	if (len < 2 || raw[0] != '"' || raw[len - 1] != '"')
		return 0;
	const uint8_t *s = raw + 1;
	uint32_t n = len - 2;
	for (uint32_t i = 0; i < n; i++) {
		uint8_t c = s[i];
		if (c == '"' || c < 0x20)
			return 0;
		if (c != '\\') {
			clink_buf_append_byte(b, c);
			continue;
		}
		if (++i == n)
			return 0;
		switch (s[i]) {
		case '"': case '\\': case '/': clink_buf_append_byte(b, s[i]); break;
		case 'b': clink_buf_append_byte(b, '\b'); break;
		case 'f': clink_buf_append_byte(b, '\f'); break;
		case 'n': clink_buf_append_byte(b, '\n'); break;
		case 'r': clink_buf_append_byte(b, '\r'); break;
		case 't': clink_buf_append_byte(b, '\t'); break;
		case 'u': {
			uint32_t r, r2;
			if (!clink__hex4(s, n, i + 1, &r))
				return 0;
			i += 4;
			if (r >= 0xD800 && r < 0xDC00) {
				/* A high surrogate: combine with a following \uDC00-\uDFFF escape. */
				if (i + 6 < n && s[i + 1] == '\\' && s[i + 2] == 'u' &&
				    clink__hex4(s, n, i + 3, &r2) && r2 >= 0xDC00 && r2 < 0xE000) {
					r = 0x10000 + ((r - 0xD800) << 10) + (r2 - 0xDC00);
					i += 6;
				} else {
					r = 0xFFFD;
				}
			} else if (r >= 0xDC00 && r < 0xE000) {
				r = 0xFFFD;
			}
			clink__append_rune(b, r);
			break;
		}
		default:
			return 0;
		}
	}
	return 1;
}

/* ---- JSON ---- */

static int clink__space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static uint32_t clink__skip_space(const uint8_t *b, uint32_t n, uint32_t i) {
	while (i < n && clink__space(b[i]))
		i++;
	return i;
}

/* Index just past the string starting at b[i] == '"', or -1. */
static int64_t clink__skip_string(const uint8_t *b, uint32_t n, uint32_t i) {
	for (i++; i < n; i++) {
		if (b[i] == '\\')
			i++;
		else if (b[i] == '"')
			return (int64_t)i + 1;
	}
	return -1;
}

/* Index just past the value starting at b[i], or -1. Scalars are delimited, not validated. */
static int64_t clink__skip_value(const uint8_t *b, uint32_t n, uint32_t i) {
	if (i >= n)
		return -1;
	switch (b[i]) {
	case '"':
		return clink__skip_string(b, n, i);
	case '{': case '[': {
		int depth = 0;
		while (i < n) {
			switch (b[i]) {
			case '"': {
				int64_t e = clink__skip_string(b, n, i);
				if (e < 0)
					return -1;
				i = (uint32_t)e;
				continue;
			}
			case '{': case '[': depth++; break;
			case '}': case ']':
				if (--depth == 0)
					return (int64_t)i + 1;
				break;
			}
			i++;
		}
		return -1;
	}
	case ',': case ':': case '}': case ']':
		return -1;
	}
	uint32_t start = i;
	while (i < n && !clink__space(b[i]) && b[i] != ',' && b[i] != '}' && b[i] != ']')
		i++;
	return i == start ? -1 : (int64_t)i;
}

int clink_json_field(const uint8_t *obj, uint32_t n, const char *name, const uint8_t **raw,
		     uint32_t *raw_len) {
	size_t name_len = strlen(name);
	uint32_t i = clink__skip_space(obj, n, 0);
	if (i >= n || obj[i] != '{')
		return 0;
	i++;
	for (;;) {
		i = clink__skip_space(obj, n, i);
		if (i >= n || obj[i] != '"')
			return 0;
		int64_t end = clink__skip_string(obj, n, i);
		if (end < 0)
			return 0;
		int match = (size_t)(end - 2 - i) == name_len && memcmp(obj + i + 1, name, name_len) == 0;
		i = clink__skip_space(obj, n, (uint32_t)end);
		if (i >= n || obj[i] != ':')
			return 0;
		i = clink__skip_space(obj, n, i + 1);
		int64_t vend = clink__skip_value(obj, n, i);
		if (vend < 0)
			return 0;
		if (match) {
			*raw = obj + i;
			*raw_len = (uint32_t)(vend - i);
			return 1;
		}
		i = clink__skip_space(obj, n, (uint32_t)vend);
		if (i >= n || obj[i] != ',')
			return 0;
		i++;
	}
}

int clink_json_parse_int(const uint8_t *raw, uint32_t len, int64_t *v) {
	uint32_t i = 0;
	int neg = 0;
	if (len > 0 && raw[0] == '-') {
		neg = 1;
		i = 1;
	}
	if (i >= len || (raw[i] == '0' && len > i + 1))
		return 0;
	/* Accumulate as a negative number: its range includes INT64_MIN. */
	int64_t n = 0;
	for (; i < len; i++) {
		uint8_t c = raw[i];
		if (c < '0' || c > '9')
			return 0;
		int64_t d = c - '0';
		if (n < (INT64_MIN + d) / 10)
			return 0;
		n = n * 10 - d;
	}
	if (!neg) {
		if (n == INT64_MIN)
			return 0;
		n = -n;
	}
	*v = n;
	return 1;
}

int clink_json_field_int(const uint8_t *obj, uint32_t len, const char *name, int64_t *v) {
	const uint8_t *raw;
	uint32_t n;
	return clink_json_field(obj, len, name, &raw, &n) && clink_json_parse_int(raw, n, v);
}

int64_t clink_i64_decode(const uint8_t *b) {
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | b[i];
	return (int64_t)v;
}

void clink_i64_encode(uint8_t *b, int64_t v) {
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)((uint64_t)v >> (8 * i));
}

/* ---- Declarations and the manifest ---- */

static int clink__valid_name(const char *s, size_t max) {
	size_t n = strlen(s);
	if (n < 1 || n > max)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '_' || c == '.' || c == '-'))
			return 0;
	}
	return 1;
}

static void clink__declare_check(const char *kind, const char *name) {
	if (clink__g.sealed) {
		clink_logf(CLINK_ERROR, "clink: %s %s declared after initialisation: declare it in clink_init", kind, name);
		__builtin_trap();
	}
	if (!clink__valid_name(name, 128)) {
		clink_logf(CLINK_ERROR, "clink: invalid %s name \"%s\": want 1-128 characters of [A-Za-z0-9_.-]", kind, name);
		__builtin_trap();
	}
}

void clink_register(const char *name, const clink_operator *op) {
	if (clink__g.sealed)
		clink__die("clink: clink_register called after initialisation");
	if (clink__g.op != NULL)
		clink__die("clink: clink_register called twice");
	if (op == NULL || op->process == NULL)
		clink__die("clink: clink_register needs an operator with a process function");
	if (!clink__valid_name(name, 64)) {
		clink_logf(CLINK_ERROR, "clink: invalid operator name \"%s\": want 1-64 characters of [A-Za-z0-9_.-]", name);
		__builtin_trap();
	}
	clink__g.name = name;
	clink__g.op = op;
}

const char *clink_name(void) { return clink__g.name; }

clink_state *clink_state_new(const char *name, int flags) {
	clink__declare_check("state", name);
	for (uint32_t i = 0; i < clink__g.n_states; i++)
		if (strcmp(clink__g.states[i].name, name) == 0) {
			clink_logf(CLINK_ERROR, "clink: state \"%s\" declared twice", name);
			__builtin_trap();
		}
	if (clink__g.n_states == CLINK__MAX_STATES)
		clink__die("clink: more than 256 states");
	struct clink_state *s = &clink__g.states[clink__g.n_states];
	s->name = name;
	s->index = clink__g.n_states++;
	s->frame = -1;
	s->stale = 0;
	s->prefetch = (flags & CLINK_PREFETCH) != 0;
	if (s->prefetch) {
		if (clink__g.n_prefetched == CLINK__MAX_PREFETCH)
			clink__die("clink: more than 16 prefetched states");
		clink__g.prefetched[clink__g.n_prefetched++] = s;
	}
	return s;
}

const char *clink_state_name(const clink_state *s) { return s->name; }
int clink_state_prefetched(const clink_state *s) { return s->prefetch; }

clink_endpoint *clink_endpoint_new(const char *name) {
	clink__declare_check("endpoint", name);
	for (uint32_t i = 0; i < clink__g.n_endpoints; i++)
		if (strcmp(clink__g.endpoints[i].name, name) == 0) {
			clink_logf(CLINK_ERROR, "clink: endpoint \"%s\" declared twice", name);
			__builtin_trap();
		}
	if (clink__g.n_endpoints == CLINK__MAX_ENDPOINTS)
		clink__die("clink: more than 64 endpoints");
	struct clink_endpoint *e = &clink__g.endpoints[clink__g.n_endpoints];
	e->name = name;
	e->index = clink__g.n_endpoints++;
	return e;
}

/* Names are validated at declaration, so they need no escaping. */
static void clink__build_manifest(void) {
	clink_buf *b = &clink__g.manifest;
	if (b->len > 0)
		return;
	if (clink__g.op == NULL)
		clink__die("clink: no operator registered: call clink_register in clink_init");
	clink__g.sealed = 1;
	clink_buf_append_str(b, "{\"abi\":1,\"name\":\"");
	clink_buf_append_str(b, clink__g.name);
	clink_buf_append_str(b, "\",\"states\":[");
	for (uint32_t i = 0; i < clink__g.n_states; i++) {
		if (i)
			clink_buf_append_byte(b, ',');
		clink_buf_append_byte(b, '"');
		clink_buf_append_str(b, clink__g.states[i].name);
		clink_buf_append_byte(b, '"');
	}
	if (clink__g.n_prefetched) {
		clink_buf_append_str(b, "],\"prefetch\":[");
		for (uint32_t i = 0; i < clink__g.n_prefetched; i++) {
			if (i)
				clink_buf_append_byte(b, ',');
			clink_buf_append_byte(b, '"');
			clink_buf_append_str(b, clink__g.prefetched[i]->name);
			clink_buf_append_byte(b, '"');
		}
	}
	clink_buf_append_str(b, "],\"endpoints\":[");
	for (uint32_t i = 0; i < clink__g.n_endpoints; i++) {
		if (i)
			clink_buf_append_byte(b, ',');
		clink_buf_append_byte(b, '"');
		clink_buf_append_str(b, clink__g.endpoints[i].name);
		clink_buf_append_byte(b, '"');
	}
	clink_buf_append_str(b, "]}");
}

/* clink_init runs from _initialize (wasi-libc's reactor start runs constructors), before the
 * host reads the manifest or calls anything else. */
__attribute__((constructor)) static void clink__ctor(void) {
	clink_init();
	clink__build_manifest();
}

/* ---- State ---- */

/* Completes a read whose value did not fit: grows b by n and takes the pending result. */
static int32_t clink__fetch(clink_buf *b, uint32_t n) {
	clink__grow(b, n);
	int32_t rc = clink__take_result(b->data + b->len, b->cap - b->len);
	if (rc < 0)
		return rc;
	b->len += (uint32_t)rc;
	return rc;
}

int32_t clink_state_get(clink_state *s, const void *entry, uint32_t entry_len,
			const uint8_t **value, uint32_t *len) {
	if (entry_len == 0 && s->frame >= 0 && !s->stale) {
		uint8_t *h = clink__g.input + s->frame;
		uint32_t n = clink__le32(h);
		if (n == CLINK__FRAME_ABSENT)
			return 0;
		*value = h + CLINK__FRAME_HEADER;
		*len = n;
		return 1;
	}
	clink_buf *b = &clink__g.result;
	if (b->cap < 512)
		clink__grow(b, 512);
	b->len = 0;
	int32_t n = clink__get_async(s->index, entry, entry_len, b->data, b->cap);
	if (n == CLINK_NOT_FOUND)
		return 0;
	if (n < 0)
		return n;
	if ((uint32_t)n > b->cap) {
		int32_t rc = clink__fetch(b, (uint32_t)n);
		if (rc < 0)
			return rc;
	}
	*value = b->data;
	*len = (uint32_t)n;
	return 1;
}

static void clink__write_frame(clink_state *s, uint32_t n, const void *value) {
	uint8_t *h = clink__g.input + s->frame;
	if (n != CLINK__FRAME_ABSENT && n)
		memmove(h + CLINK__FRAME_HEADER, value, n);
	clink__put_le32(h, n);
	clink__put_le32(h + 8, clink__le32(h + 8) | CLINK__FRAME_DIRTY);
	s->stale = 0;
}

int32_t clink_state_put(clink_state *s, const void *entry, uint32_t entry_len,
			const void *value, uint32_t len) {
	if (entry_len == 0 && s->frame >= 0) {
		uint8_t *h = clink__g.input + s->frame;
		if (len <= clink__le32(h + 4)) {
			clink__write_frame(s, len, value);
			return 0;
		}
		/* Larger than the frame: through put, and the frame must stay un-DIRTY, or the
		 * write-back would overwrite the put. A failed put changes nothing. */
		int32_t rc = clink__put(s->index, NULL, 0, value, len);
		if (rc < 0)
			return rc;
		clink__put_le32(h + 8, clink__le32(h + 8) & ~CLINK__FRAME_DIRTY);
		s->stale = 1;
		return 0;
	}
	int32_t rc = clink__put(s->index, entry, entry_len, value, len);
	return rc < 0 ? rc : 0;
}

int32_t clink_state_delete(clink_state *s, const void *entry, uint32_t entry_len) {
	if (entry_len == 0 && s->frame >= 0) {
		clink__write_frame(s, CLINK__FRAME_ABSENT, NULL);
		return 0;
	}
	int32_t rc = clink__delete(s->index, entry, entry_len);
	return rc < 0 ? rc : 0;
}

int32_t clink_state_get_i64(clink_state *s, const void *entry, uint32_t entry_len, int64_t *v) {
	const uint8_t *p;
	uint32_t n;
	*v = 0;
	int32_t rc = clink_state_get(s, entry, entry_len, &p, &n);
	if (rc <= 0)
		return rc;
	if (n != 8)
		return CLINK_INVALID_ARGUMENT;
	*v = clink_i64_decode(p);
	return 1;
}

int32_t clink_state_put_i64(clink_state *s, const void *entry, uint32_t entry_len, int64_t v) {
	uint8_t b[8];
	clink_i64_encode(b, v);
	return clink_state_put(s, entry, entry_len, b, 8);
}

/* Locates the prefetched states' frames from offset off and checks what the host wrote. A
 * malformed frame most likely means a host that does not know the manifest's prefetch field. */
static int clink__load_frames(uint64_t off) {
	for (uint32_t i = 0; i < clink__g.n_prefetched; i++) {
		struct clink_state *s = clink__g.prefetched[i];
		const char *what = NULL;
		if (off + CLINK__FRAME_HEADER > clink__g.input_cap) {
			what = "its frame lies outside the input buffer";
		} else {
			uint8_t *h = clink__g.input + off;
			uint32_t n = clink__le32(h), c = clink__le32(h + 4);
			if (c < CLINK__FRAME_MIN_CAP || c % 8 != 0 || off + CLINK__FRAME_HEADER + c > clink__g.input_cap)
				what = "its frame has an invalid cap";
			else if (n != CLINK__FRAME_ABSENT && n != CLINK__FRAME_TOO_LARGE && n > c)
				what = "its frame has len > cap";
			else {
				s->frame = (int64_t)off;
				s->stale = n == CLINK__FRAME_TOO_LARGE;
				off += CLINK__FRAME_HEADER + c;
				continue;
			}
		}
		clink_logf(CLINK_ERROR, "clink: prefetched state \"%s\": %s (does the host support the manifest's prefetch field? docs/abi.md, \"Prefetched values\")", s->name, what);
		return 0;
	}
	return 1;
}

static void clink__end_call(void) {
	clink__g.emitting = 0;
	for (uint32_t i = 0; i < clink__g.n_prefetched; i++)
		clink__g.prefetched[i]->frame = -1;
}

/* ---- Lookup ---- */

static int clink__safe_line(const char *s) { return strchr(s, '\n') == NULL && strchr(s, '\r') == NULL; }

int32_t clink_lookup(clink_endpoint *e, const char *method, const char *path,
		     const clink_header *headers, size_t n_headers, const void *body,
		     uint32_t body_len, clink_response *resp) {
	if (!clink__safe_line(method) || !clink__safe_line(path))
		return CLINK_LOOKUP_REFUSED;
	clink_buf *r = &clink__g.request;
	r->len = 0;
	clink_buf_append_str(r, method);
	clink_buf_append_byte(r, ' ');
	clink_buf_append_str(r, path);
	clink_buf_append_byte(r, '\n');
	for (size_t i = 0; i < n_headers; i++) {
		const clink_header *h = &headers[i];
		if (h->name[0] == 0 || !clink__safe_line(h->name) || strchr(h->name, ':') != NULL ||
		    !clink__safe_line(h->value))
			return CLINK_LOOKUP_REFUSED;
		clink_buf_append_str(r, h->name);
		clink_buf_append_str(r, ": ");
		clink_buf_append_str(r, h->value);
		clink_buf_append_byte(r, '\n');
	}
	if (body_len > 0) {
		clink_buf_append_byte(r, '\n');
		clink_buf_append(r, body, body_len);
	}
	clink_buf *b = &clink__g.result;
	if (b->cap < 512)
		clink__grow(b, 512);
	b->len = 0;
	int64_t packed = clink__lookup(e->index, r->data, r->len, b->data, b->cap);
	if (r->cap > (1u << 20))
		clink_buf_free(r); /* do not pin a huge request buffer */
	if (packed < 0)
		return (int32_t)packed;
	uint32_t n = (uint32_t)packed;
	if (n > b->cap) {
		int32_t rc = clink__fetch(b, n);
		if (rc < 0)
			return rc;
	}
	resp->status = (int32_t)(packed >> 32);
	resp->body = b->data;
	resp->body_len = n;
	return 0;
}

/* ---- Emit: the output area (docs/abi.md, "The output area") ---- */

static void clink__append_record(uint32_t used, const void *key, uint32_t kl, const void *value, uint32_t vl) {
	uint8_t *a = clink__area + 4 + used;
	clink__put_le32(a, kl);
	clink__put_le32(a + 4, vl);
	if (kl)
		memcpy(a + 8, key, kl);
	if (vl)
		memcpy(a + 8 + kl, value, vl);
	clink__put_le32(clink__area, used + 8 + kl + vl);
}

int32_t clink_emit(const void *key, uint32_t key_len, const void *value, uint32_t value_len) {
	if (clink__g.emitting) {
		if (clink__g.area_state == 0)
			clink__g.area_state = clink__output_area(clink__area, CLINK__AREA_SIZE) < 0 ? -1 : 1;
		if (clink__g.area_state > 0) {
			uint64_t need = 8 + (uint64_t)key_len + value_len;
			uint32_t used = clink__le32(clink__area);
			if (4 + (uint64_t)used + need <= CLINK__AREA_SIZE) {
				clink__append_record(used, key, key_len, value, value_len);
				return 0;
			}
			if (used > 0) {
				int32_t rc = clink__flush_output();
				if (rc < 0)
					return rc;
			}
			if (4 + need <= CLINK__AREA_SIZE) {
				clink__append_record(0, key, key_len, value, value_len);
				return 0;
			}
			/* Larger than the area: the area is empty now, so the import keeps the order. */
		}
	}
	int32_t rc = clink__emit(key, key_len, value, value_len);
	return rc < 0 ? rc : 0;
}

/* ---- Time, timers, order ---- */

int32_t clink_timer_register(int64_t timestamp) {
	if (clink__g.op == NULL || clink__g.op->on_timer == NULL)
		return CLINK_NOT_ALLOWED;
	int32_t rc = clink__timer_register(timestamp);
	return rc < 0 ? rc : 0;
}

int32_t clink_timer_delete(int64_t timestamp) {
	int32_t rc = clink__timer_delete(timestamp);
	return rc < 0 ? rc : 0;
}

int64_t clink_watermark(void) { return clink__watermark(); }
int64_t clink_processing_time(void) { return clink__processing_time(); }
void clink_set_resume_order(int64_t order) { clink__set_resume_order(order); }

/* ---- Exports (docs/abi.md, "Exports") ---- */

/* A non-zero return from a callback: make sure the host has a message to report. */
static int32_t clink__result(const char *what, int rc) {
	if (rc != 0 && !clink__g.logged_error)
		clink_logf(CLINK_ERROR, "operator %s: %s returned %d", clink__g.name, what, rc);
	return rc != 0;
}

__attribute__((export_name("clink_input"))) uint8_t *clink__export_input(uint32_t cap) {
	if (cap > CLINK__MAX_INPUT)
		return NULL;
	if (cap == 0)
		cap = 1;
	if (cap > clink__g.input_cap) {
		uint8_t *p = (uint8_t *)realloc(clink__g.input, cap);
		if (p == NULL)
			return NULL;
		clink__g.input = p;
		clink__g.input_cap = cap;
	}
	return clink__g.input;
}

__attribute__((export_name("clink_process"))) int32_t clink__export_process(uint32_t key_len, uint32_t value_len, int64_t timestamp) {
	clink__g.logged_error = 0;
	uint64_t end = (uint64_t)key_len + value_len;
	if (clink__g.n_prefetched && !clink__load_frames((end + 7) & ~(uint64_t)7)) {
		clink__end_call();
		return 1;
	}
	clink_record r;
	r.key = clink__g.input;
	r.key_len = key_len;
	r.value = clink__g.input + key_len;
	r.value_len = value_len;
	r.timestamp = timestamp;
	clink__g.emitting = 1;
	int rc = clink__g.op->process(&r);
	clink__end_call();
	return clink__result("process", rc);
}

__attribute__((export_name("clink_on_timer"))) int32_t clink__export_on_timer(uint32_t key_len, int64_t timestamp) {
	clink__g.logged_error = 0;
	if (clink__g.op->on_timer == NULL) {
		clink_logf(CLINK_ERROR, "clink: a timer fired but operator %s has no on_timer", clink__g.name);
		return 1;
	}
	if (clink__g.n_prefetched && !clink__load_frames(((uint64_t)key_len + 7) & ~(uint64_t)7)) {
		clink__end_call();
		return 1;
	}
	clink__g.emitting = 1;
	int rc = clink__g.op->on_timer(clink__g.input, key_len, timestamp);
	clink__end_call();
	return clink__result("on_timer", rc);
}

__attribute__((export_name("clink_open"))) int32_t clink__export_open(void) {
	clink__g.logged_error = 0;
	clink__g.sealed = 1;
	return clink__g.op->open ? clink__result("open", clink__g.op->open()) : 0;
}

__attribute__((export_name("clink_close"))) int32_t clink__export_close(void) {
	clink__g.logged_error = 0;
	if (clink__g.op->close == NULL)
		return 0;
	clink__g.emitting = 1;
	int rc = clink__g.op->close();
	clink__g.emitting = 0;
	return clink__result("close", rc);
}

__attribute__((export_name("clink_manifest"))) uint64_t clink__export_manifest(void) {
	clink__build_manifest();
	return (uint64_t)(uintptr_t)clink__g.manifest.data << 32 | clink__g.manifest.len;
}

#ifdef CLINK_KEY_FUNCTION
int CLINK_KEY_FUNCTION(const uint8_t *value, uint32_t value_len, const uint8_t **key, uint32_t *key_len);

__attribute__((export_name("clink_key"))) int64_t clink__export_key(uint32_t value_len) {
	const uint8_t *k = NULL;
	uint32_t kl = 0;
	if (!CLINK_KEY_FUNCTION(clink__g.input, value_len, &k, &kl))
		return -1;
	return (int64_t)((uint64_t)(uintptr_t)k << 32 | kl);
}
#endif

#ifdef __cplusplus
}
#endif

#endif /* CLINK_IMPL_H */
