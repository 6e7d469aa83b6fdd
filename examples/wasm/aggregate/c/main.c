/* aggregate keeps a running count, sum, min and max of the integer field "value" per key and
 * emits {"key":K,"count":N,"sum":S,"min":MIN,"max":MAX} for every record it aggregates.
 *
 * A record whose "value" is missing or not a JSON integer within int64 is skipped with a
 * warning in the operator log. A sum that would overflow int64 fails the record.
 *
 *   clang --target=wasm32-wasi -O2 -mexec-model=reactor -I ../../../../guest-sdk/c \
 *       -o aggregate-c.wasm main.c
 */
#include "clink.h"

/* Per record key: count, sum, min and max as four little-endian int64s. Prefetched: delivered
 * with each record and written back by the host, with no import call. */
static clink_state *aggs;

static clink_buf out;

static void field(const char *name, int64_t v) {
	clink_buf_append_str(&out, name);
	clink_buf_append_i64(&out, v);
}

static int process(const clink_record *r) {
	int64_t v;
	if (!clink_json_field_int(r->value, r->value_len, "value", &v)) {
		clink_log_str(CLINK_WARN, "skipping a record whose \"value\" is not an integer");
		return 0;
	}
	const uint8_t *got;
	uint32_t got_len;
	int32_t rc = clink_state_get(aggs, NULL, 0, &got, &got_len);
	if (rc < 0)
		return rc;
	int64_t count, sum, lo, hi;
	if (rc == 0) {
		count = 1, sum = v, lo = v, hi = v;
	} else if (got_len != 32) {
		clink_log_str(CLINK_ERROR, "aggregate: corrupt state (want 32 bytes)");
		return 1;
	} else {
		count = clink_i64_decode(got) + 1;
		sum = clink_i64_decode(got + 8);
		lo = clink_i64_decode(got + 16);
		hi = clink_i64_decode(got + 24);
		if ((v > 0 && sum > INT64_MAX - v) || (v < 0 && sum < INT64_MIN - v)) {
			clink_log_str(CLINK_ERROR, "aggregate: sum overflows int64");
			return 1;
		}
		sum += v;
		lo = v < lo ? v : lo;
		hi = v > hi ? v : hi;
	}
	uint8_t buf[32];
	clink_i64_encode(buf, count);
	clink_i64_encode(buf + 8, sum);
	clink_i64_encode(buf + 16, lo);
	clink_i64_encode(buf + 24, hi);
	if ((rc = clink_state_put(aggs, NULL, 0, buf, sizeof buf)) < 0)
		return rc;

	clink_buf_reset(&out);
	clink_buf_append_str(&out, "{\"key\":");
	clink_buf_json_string(&out, r->key, r->key_len);
	field(",\"count\":", count);
	field(",\"sum\":", sum);
	field(",\"min\":", lo);
	field(",\"max\":", hi);
	clink_buf_append_byte(&out, '}');
	return clink_emit(r->key, r->key_len, out.data, out.len);
}

void clink_init(void) {
	static const clink_operator op = {process, NULL, NULL, NULL};
	clink_register("aggregate", &op);
	aggs = clink_state_new("agg", CLINK_PREFETCH);
}
