/*
 * clink.h: the clink-wasm guest SDK for C and C++, header-only.
 *
 * Write a keyed stream operator against the guest ABI v1 (docs/abi.md) and build it with clang
 * and wasi-libc as a WASI reactor:
 *
 *     clang --target=wasm32-wasi -O2 -mexec-model=reactor -o op.wasm op.c
 *
 * The operator's file includes this header and defines clink_init(), which the SDK runs once
 * per instance (from _initialize, before the host reads the manifest). clink_init registers the
 * operator and declares its states and endpoints; the SDK builds the manifest from them and
 * exports every entry point the host calls:
 *
 *     #include "clink.h"
 *
 *     static clink_state *counts;
 *
 *     static int process(const clink_record *r) {
 *         int64_t n = 0;
 *         if (clink_state_get_i64(counts, NULL, 0, &n) < 0) return 1;
 *         ...
 *         return clink_emit(r->key, r->key_len, out, out_len) < 0;
 *     }
 *
 *     void clink_init(void) {
 *         static const clink_operator op = {process};
 *         clink_register("counter", &op);
 *         counts = clink_state_new("count", CLINK_PREFETCH);
 *     }
 *
 * The API is the Go and AssemblyScript SDKs' (guest-sdk/README.md): states with prefetch (the
 * fast path: a prefetched state's per-key value travels with the record and is written back by
 * the host, with no import call), lookups, emit through the output area, timers, watermark and
 * processing time, logs, an optional key function, and a small JSON toolkit that behaves exactly
 * like the Go SDK's jsonx.
 *
 * Conventions: functions that can fail return an int32_t that is 0 (or a length, or 1 for
 * "found") on success and a negative CLINK_* result code otherwise. An operator callback returns
 * 0 on success; any other value fails the record: the host fails the pipeline with the
 * operator's last error-level log line of the call (the SDK logs one naming the return value if
 * the operator logged none).
 *
 * One translation unit of a module includes this header plainly: it gets the SDK's definitions
 * and the module's exports. Any other translation unit defines CLINK_DECLARATIONS_ONLY before
 * including it. Define CLINK_KEY_FUNCTION as the name of a function
 *     int f(const uint8_t *value, uint32_t value_len, const uint8_t **key, uint32_t *key_len)
 * (returning 1 to accept with *key set, 0 to reject the record as malformed) before including
 * the header to export clink_key: the key function is a capability, so only modules that define
 * one export it.
 *
 * C99 or later, or C++11 or later. Single-threaded, like every WebAssembly instance.
 */
#ifndef CLINK_H
#define CLINK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ABI version this SDK speaks (imports from module "clink_v1"). */
#define CLINK_ABI_VERSION 1

/* Result codes (docs/abi.md, "Result codes"). */
#define CLINK_NOT_FOUND (-1)
#define CLINK_INVALID_ARGUMENT (-2)
#define CLINK_OUT_OF_BOUNDS (-3)
#define CLINK_TOO_LARGE (-4)
#define CLINK_NOT_ALLOWED (-5)
#define CLINK_NO_RESULT (-6)
#define CLINK_BUFFER_TOO_SMALL (-7)
#define CLINK_LOOKUP_TIMEOUT (-16)
#define CLINK_LOOKUP_BREAKER_OPEN (-17)
#define CLINK_LOOKUP_RESPONSE_TOO_LARGE (-18)
#define CLINK_LOOKUP_REFUSED (-19)
#define CLINK_LOOKUP_UNAVAILABLE (-20)
#define CLINK_LOOKUP_CANCELLED (-21)

/* Log levels. */
#define CLINK_DEBUG 0
#define CLINK_INFO 1
#define CLINK_WARN 2
#define CLINK_ERROR 3

/* Watermark values with a special meaning. */
#define CLINK_WATERMARK_NONE INT64_MIN /* before the first watermark */
#define CLINK_WATERMARK_END INT64_MAX  /* end of input */

/* clink_state_new flags. */
#define CLINK_PREFETCH 1

/* One input record. key and value point into the host's input buffer: valid until the
 * callback returns. */
typedef struct clink_record {
	const uint8_t *key;
	uint32_t key_len;
	const uint8_t *value;
	uint32_t value_len;
	int64_t timestamp; /* event time, ms since the Unix epoch */
} clink_record;

/* The operator: process is required, the others may be NULL. on_timer runs in the context of
 * the timer's key, like process for a record of that key. open runs once per instance (not
 * once per pipeline); close may emit (to flush). State and timers are not available in open
 * and close. */
typedef struct clink_operator {
	int (*process)(const clink_record *r);
	int (*on_timer)(const uint8_t *key, uint32_t key_len, int64_t timestamp);
	int (*open)(void);
	int (*close)(void);
} clink_operator;

/* A named keyed state (declared with clink_state_new) and a named lookup endpoint
 * (clink_endpoint_new). */
typedef struct clink_state clink_state;
typedef struct clink_endpoint clink_endpoint;

/* One request header. */
typedef struct clink_header {
	const char *name;
	const char *value;
} clink_header;

/* A lookup response: status is the HTTP status, body a view of the SDK's result buffer, valid
 * until the next state read or lookup. */
typedef struct clink_response {
	int32_t status;
	const uint8_t *body;
	uint32_t body_len;
} clink_response;

/* A growable byte buffer for building output. Zero-initialise it ({0}); clink_buf_free
 * releases it. Appends abort the call (a trap, reported by the host) if memory runs out. */
typedef struct clink_buf {
	uint8_t *data;
	uint32_t len;
	uint32_t cap;
} clink_buf;

/* Defined by the operator: registers it and declares states and endpoints. */
void clink_init(void);

/* Registration and declarations: only from clink_init. An invalid or duplicate name, or a
 * declaration past the limits (256 states, 16 prefetched, 64 endpoints), logs the reason and
 * traps, so that the module fails to load with that message. */
void clink_register(const char *name, const clink_operator *op);
clink_state *clink_state_new(const char *name, int flags);
clink_endpoint *clink_endpoint_new(const char *name);
const char *clink_name(void);
const char *clink_state_name(const clink_state *s);
int clink_state_prefetched(const clink_state *s);

/* Keyed state of the current record's key; entry (may be NULL with entry_len 0) is the entry
 * within that key's map. Allowed in process and on_timer (CLINK_NOT_ALLOWED elsewhere).
 * clink_state_get returns 1 with *value and *len set (a view valid until the next read or
 * lookup), 0 when the entry is absent, or a negative code. It may suspend while the host loads
 * a cold value; the operator does not see it. */
int32_t clink_state_get(clink_state *s, const void *entry, uint32_t entry_len,
			const uint8_t **value, uint32_t *len);
int32_t clink_state_put(clink_state *s, const void *entry, uint32_t entry_len,
			const void *value, uint32_t len);
int32_t clink_state_delete(clink_state *s, const void *entry, uint32_t entry_len);
/* 8-byte little-endian integers (the layout of the other SDKs' PutInt64 / putI64). get_i64
 * returns 1 and sets *v when found, 0 (and *v = 0) when absent, CLINK_INVALID_ARGUMENT for a
 * value that is not 8 bytes. */
int32_t clink_state_get_i64(clink_state *s, const void *entry, uint32_t entry_len, int64_t *v);
int32_t clink_state_put_i64(clink_state *s, const void *entry, uint32_t entry_len, int64_t v);

/* Sends an HTTP request through the endpoint and waits for the response (docs/abi.md, "Lookup
 * request format"): method and path are NUL-terminated, path starts with "/" and is appended
 * to the endpoint's base path; headers may be NULL. Returns 0 with *resp set (whatever the
 * status), or a negative code (CLINK_LOOKUP_*). A method, path or header with a line break is
 * refused here, as CLINK_LOOKUP_REFUSED. May suspend. */
int32_t clink_lookup(clink_endpoint *e, const char *method, const char *path,
		     const clink_header *headers, size_t n_headers, const void *body,
		     uint32_t body_len, clink_response *resp);

/* Emits an output record, stamped with the timestamp of the record or timer being processed.
 * Allowed in process, on_timer and close. Records are buffered in the output area and
 * delivered in order when the call returns. */
int32_t clink_emit(const void *key, uint32_t key_len, const void *value, uint32_t value_len);

/* Event-time timers of the current key (process and on_timer only; register needs an
 * operator with on_timer). */
int32_t clink_timer_register(int64_t timestamp);
int32_t clink_timer_delete(int64_t timestamp);
int64_t clink_watermark(void);
int64_t clink_processing_time(void);
void clink_set_resume_order(int64_t order);

/* Logging. The last error-level message of a failing call is attached to the host's report. */
void clink_log(int level, const void *msg, uint32_t len);
void clink_log_str(int level, const char *msg);
void clink_logf(int level, const char *format, ...) __attribute__((format(printf, 2, 3)));

/* The name of a result code ("LOOKUP_TIMEOUT"), and whether a failed lookup may succeed if
 * tried again later (timeouts, an open breaker, an unavailable upstream). */
const char *clink_code_name(int32_t code);
int clink_retryable(int32_t code);

/* Little-endian int64 encoding, as the state helpers use. */
int64_t clink_i64_decode(const uint8_t *b);
void clink_i64_encode(uint8_t *b, int64_t v);

/* JSON toolkit, exactly the Go SDK's jsonx (guest-sdk/go/clink/jsonx). clink_json_field finds
 * the first top-level field called name (raw JSON text compared) and returns 1 with *raw,
 * *raw_len set to its value's text (a string with its quotes), or 0. clink_json_parse_int
 * accepts -?(0|[1-9][0-9]*) within int64. clink_buf_json_unquote appends the decoded text of a
 * JSON string (quotes included in raw) and returns 0 if raw is not one. */
int clink_json_field(const uint8_t *obj, uint32_t len, const char *name, const uint8_t **raw,
		     uint32_t *raw_len);
int clink_json_parse_int(const uint8_t *raw, uint32_t len, int64_t *v);
int clink_json_field_int(const uint8_t *obj, uint32_t len, const char *name, int64_t *v);

void clink_buf_reset(clink_buf *b);
void clink_buf_free(clink_buf *b);
void clink_buf_append(clink_buf *b, const void *p, uint32_t n);
void clink_buf_append_str(clink_buf *b, const char *s);
void clink_buf_append_byte(clink_buf *b, uint8_t c);
void clink_buf_append_i64(clink_buf *b, int64_t v);
void clink_buf_json_string(clink_buf *b, const void *s, uint32_t n);
int clink_buf_json_unquote(clink_buf *b, const uint8_t *raw, uint32_t len);

#ifdef __cplusplus
}
#endif

#ifndef CLINK_DECLARATIONS_ONLY
#include "clink_impl.h"
#endif

#endif /* CLINK_H */
