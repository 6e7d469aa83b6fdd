/* counter counts records per key and emits {"key":K,"count":N} per record.
 *
 *   clang --target=wasm32-wasi -O2 -mexec-model=reactor -I ../../../../guest-sdk/c \
 *       -o counter-c.wasm main.c
 */
#include "clink.h"

/* Prefetched: the host delivers each key's count with the record and takes it back written,
 * so the read-modify-write below makes no import call. */
static clink_state *counts;

static clink_buf out; /* reused for every record */

static int process(const clink_record *r) {
	int64_t n;
	int32_t rc = clink_state_get_i64(counts, NULL, 0, &n);
	if (rc < 0)
		return rc;
	n++;
	if ((rc = clink_state_put_i64(counts, NULL, 0, n)) < 0)
		return rc;
	clink_buf_reset(&out);
	clink_buf_append_str(&out, "{\"key\":");
	clink_buf_json_string(&out, r->key, r->key_len);
	clink_buf_append_str(&out, ",\"count\":");
	clink_buf_append_i64(&out, n);
	clink_buf_append_byte(&out, '}');
	return clink_emit(r->key, r->key_len, out.data, out.len);
}

void clink_init(void) {
	static const clink_operator op = {process, NULL, NULL, NULL};
	clink_register("counter", &op);
	counts = clink_state_new("count", CLINK_PREFETCH);
}
