/* Exercises every part of the C SDK inside a real wasm module. The record value is a command;
 * guest-sdk/sdktest runs the same script against this module and the Go, AssemblyScript and
 * Rust ones and expects the same output from all of them. */
#define CLINK_KEY_FUNCTION key_of_user
#include "clink.h"

static clink_state *kv, *dict, *big, *pf, *pf2;
static clink_endpoint *echo;
static clink_buf out, tmp, key_buf;

/* A failed SDK call fails the record with the code's name as its message. */
#define CHECK(call)                                                   \
	do {                                                          \
		int32_t rc_ = (call);                                 \
		if (rc_ < 0) {                                        \
			clink_log_str(CLINK_ERROR, clink_code_name(rc_)); \
			return 1;                                     \
		}                                                     \
	} while (0)

static int fail(const char *msg) {
	clink_log_str(CLINK_ERROR, msg);
	return 1;
}

static int emit_out(const clink_record *r) { return clink_emit(r->key, r->key_len, out.data, out.len) < 0; }

static int emit_str(const clink_record *r, const char *s) {
	return clink_emit(r->key, r->key_len, s, (uint32_t)strlen(s)) < 0;
}

static int lookup_result(const clink_record *r, int32_t rc, const clink_response *resp) {
	clink_buf_reset(&out);
	if (rc < 0) {
		clink_buf_append_str(&out, "{\"error\":\"");
		clink_buf_append_str(&out, clink_code_name(rc));
		clink_buf_append_str(&out, clink_retryable(rc) ? "\",\"retryable\":true}" : "\",\"retryable\":false}");
	} else {
		clink_buf_append_str(&out, "{\"status\":");
		clink_buf_append_i64(&out, resp->status);
		clink_buf_append_str(&out, ",\"body\":");
		clink_buf_json_string(&out, resp->body, resp->body_len);
		clink_buf_append_byte(&out, '}');
	}
	return emit_out(r);
}

/* Emits {"get":V} for pf's value, or {"get":null}. */
static int emit_get(const clink_record *r) {
	const uint8_t *v;
	uint32_t n;
	int32_t rc = clink_state_get(pf, NULL, 0, &v, &n);
	CHECK(rc);
	if (rc == 0)
		return emit_str(r, "{\"get\":null}");
	clink_buf_reset(&out);
	clink_buf_append_str(&out, "{\"get\":");
	clink_buf_json_string(&out, v, n);
	clink_buf_append_byte(&out, '}');
	return emit_out(r);
}

/* A JSON string of size bytes that starts with i: "17     ". */
static void padded(int i, int size) {
	clink_buf_reset(&tmp);
	clink_buf_append_byte(&tmp, '"');
	clink_buf_append_i64(&tmp, i);
	while ((int)tmp.len < size - 1)
		clink_buf_append_byte(&tmp, ' ');
	clink_buf_append_byte(&tmp, '"');
}

static int64_t atoi64(const char *s) {
	int64_t v = 0;
	clink_json_parse_int((const uint8_t *)s, (uint32_t)strlen(s), &v);
	return v;
}

static int open_op(void) {
	if (clink_state_put(kv, NULL, 0, "x", 1) == CLINK_NOT_ALLOWED)
		clink_log_str(CLINK_INFO, "open: put NOT_ALLOWED");
	if (clink_emit(NULL, 0, "1", 1) == CLINK_NOT_ALLOWED)
		clink_log_str(CLINK_INFO, "open: emit NOT_ALLOWED");
	if (clink_state_put(pf, NULL, 0, "x", 1) == CLINK_NOT_ALLOWED)
		clink_log_str(CLINK_INFO, "open: prefetched put NOT_ALLOWED");
	return 0;
}

static int close_op(void) { return clink_emit(NULL, 0, "{\"closed\":true}", 15) < 0; }

static int on_timer(const uint8_t *key, uint32_t key_len, int64_t ts) {
	clink_buf_reset(&out);
	clink_buf_append_str(&out, "{\"timer\":");
	clink_buf_append_i64(&out, ts);
	clink_buf_append_str(&out, ",\"key\":");
	clink_buf_json_string(&out, key, key_len);
	/* A timer gets its key's frames too: read pf2, write pf2+timestamp back. */
	int64_t n;
	int32_t rc = clink_state_get_i64(pf2, NULL, 0, &n);
	CHECK(rc);
	if (rc == 1) {
		CHECK(clink_state_put_i64(pf2, NULL, 0, n + ts));
		clink_buf_append_str(&out, ",\"pf2\":");
		clink_buf_append_i64(&out, n);
	}
	clink_buf_append_byte(&out, '}');
	return clink_emit(key, key_len, out.data, out.len) < 0;
}

static int process(const clink_record *r) {
	/* The command and its argument, NUL-terminated copies. */
	static clink_buf text;
	clink_buf_reset(&text);
	clink_buf_append(&text, r->value, r->value_len);
	clink_buf_append_byte(&text, 0);
	char *cmd = (char *)text.data;
	char *arg = strchr(cmd, ' ');
	if (arg != NULL)
		*arg++ = 0;
	else
		arg = cmd + strlen(cmd);
	uint32_t arg_len = (uint32_t)strlen(arg);
	const uint8_t *v;
	uint32_t n;
	int64_t i64;
	int32_t rc;
	clink_response resp;

	if (strcmp(cmd, "count") == 0) {
		CHECK(clink_state_get_i64(kv, NULL, 0, &i64));
		CHECK(clink_state_put_i64(kv, NULL, 0, ++i64));
		clink_buf_reset(&out);
		clink_buf_append_str(&out, "{\"count\":");
		clink_buf_append_i64(&out, i64);
		clink_buf_append_byte(&out, '}');
		return emit_out(r);
	} else if (strcmp(cmd, "put") == 0) {
		char *eq = strchr(arg, '=');
		if (eq == NULL)
			return fail("put: want K=V");
		CHECK(clink_state_put(dict, arg, (uint32_t)(eq - arg), eq + 1, (uint32_t)strlen(eq + 1)));
	} else if (strcmp(cmd, "get") == 0) {
		CHECK(rc = clink_state_get(dict, arg, arg_len, &v, &n));
		if (rc == 0)
			return emit_str(r, "{\"get\":null}");
		clink_buf_reset(&out);
		clink_buf_append_str(&out, "{\"get\":");
		clink_buf_json_string(&out, v, n);
		clink_buf_append_byte(&out, '}');
		return emit_out(r);
	} else if (strcmp(cmd, "del") == 0) {
		CHECK(clink_state_delete(dict, arg, arg_len));
	} else if (strcmp(cmd, "big") == 0) {
		int size = (int)atoi64(arg);
		clink_buf_reset(&tmp);
		for (int i = 0; i < size; i++)
			clink_buf_append_byte(&tmp, (uint8_t)('a' + i % 7));
		CHECK(clink_state_put(big, "e", 1, tmp.data, tmp.len));
		CHECK(rc = clink_state_get(big, "e", 1, &v, &n));
		if (rc == 0 || n != tmp.len || (n && memcmp(v, tmp.data, n) != 0))
			return fail("big: get returned something else");
		clink_buf_reset(&out);
		clink_buf_append_str(&out, "{\"big\":");
		clink_buf_append_i64(&out, n);
		clink_buf_append_byte(&out, '}');
		return emit_out(r);
	} else if (strcmp(cmd, "has") == 0) {
		CHECK(rc = clink_state_get(big, "e", 1, &v, &n));
		return emit_str(r, rc ? "{\"has\":true}" : "{\"has\":false}");
	} else if (strcmp(cmd, "timer") == 0) {
		CHECK(clink_timer_register(atoi64(arg)));
	} else if (strcmp(cmd, "deltimer") == 0) {
		CHECK(clink_timer_delete(atoi64(arg)));
	} else if (strcmp(cmd, "lookup") == 0) {
		static const clink_header h[] = {{"X-Test", "1"}};
		rc = clink_lookup(echo, "GET", arg, h, 1, NULL, 0, &resp);
		return lookup_result(r, rc, &resp);
	} else if (strcmp(cmd, "post") == 0) {
		rc = clink_lookup(echo, "POST", "/echo", NULL, 0, arg, arg_len, &resp);
		return lookup_result(r, rc, &resp);
	} else if (strcmp(cmd, "inject") == 0) {
		rc = clink_lookup(echo, "GET", "/x\nHost: evil", NULL, 0, NULL, 0, &resp);
		return lookup_result(r, rc, &resp);
	} else if (strcmp(cmd, "hot") == 0) {
		CHECK(clink_state_get_i64(kv, "hot", 3, &i64));
		CHECK(clink_state_put_i64(kv, "hot", 3, ++i64));
		clink_buf_reset(&out);
		clink_buf_append_str(&out, "{\"key\":");
		clink_buf_json_string(&out, r->key, r->key_len);
		clink_buf_append_str(&out, ",\"hot\":");
		clink_buf_append_i64(&out, i64);
		clink_buf_append_byte(&out, '}');
		return emit_out(r);
	} else if (strcmp(cmd, "phot") == 0) {
		/* The counter example's hot path on a prefetched state: no import call. */
		CHECK(clink_state_get_i64(pf2, NULL, 0, &i64));
		CHECK(clink_state_put_i64(pf2, NULL, 0, ++i64));
		clink_buf_reset(&out);
		clink_buf_append_str(&out, "{\"key\":");
		clink_buf_json_string(&out, r->key, r->key_len);
		clink_buf_append_str(&out, ",\"phot\":");
		clink_buf_append_i64(&out, i64);
		clink_buf_append_byte(&out, '}');
		return emit_out(r);
	} else if (strcmp(cmd, "pcount") == 0) {
		int64_t m;
		CHECK(clink_state_get_i64(pf, NULL, 0, &i64));
		CHECK(clink_state_put_i64(pf, NULL, 0, ++i64));
		CHECK(clink_state_get_i64(pf2, NULL, 0, &m));
		m += 10;
		CHECK(clink_state_put_i64(pf2, NULL, 0, m));
		clink_buf_reset(&out);
		clink_buf_append_str(&out, "{\"pf\":");
		clink_buf_append_i64(&out, i64);
		clink_buf_append_str(&out, ",\"pf2\":");
		clink_buf_append_i64(&out, m);
		clink_buf_append_byte(&out, '}');
		return emit_out(r);
	} else if (strcmp(cmd, "pget") == 0) {
		return emit_get(r);
	} else if (strcmp(cmd, "phas") == 0) {
		CHECK(rc = clink_state_get(pf, NULL, 0, &v, &n));
		return emit_str(r, rc ? "{\"has\":true}" : "{\"has\":false}");
	} else if (strcmp(cmd, "pputs") == 0) {
		/* Each space-separated value in turn: write it, read it back. */
		char *p = arg;
		for (;;) {
			char *sp = strchr(p, ' ');
			uint32_t len = sp ? (uint32_t)(sp - p) : (uint32_t)strlen(p);
			CHECK(clink_state_put(pf, NULL, 0, p, len));
			if (emit_get(r))
				return 1;
			if (sp == NULL)
				break;
			p = sp + 1;
		}
	} else if (strcmp(cmd, "pdel") == 0) {
		CHECK(clink_state_delete(pf, NULL, 0));
		return emit_get(r);
	} else if (strcmp(cmd, "pputdel") == 0) {
		/* Write (maybe larger than the frame), then delete, in one call. */
		CHECK(clink_state_put(pf, NULL, 0, arg, arg_len));
		CHECK(clink_state_delete(pf, NULL, 0));
		return emit_get(r);
	} else if (strcmp(cmd, "pentry") == 0) {
		/* Another entry of a prefetched state: through the imports. */
		CHECK(clink_state_put(pf, "x", 1, arg, arg_len));
		CHECK(rc = clink_state_get(pf, "x", 1, &v, &n));
		clink_buf_reset(&out);
		clink_buf_append_str(&out, "{\"entry\":");
		clink_buf_json_string(&out, v, rc ? n : 0);
		clink_buf_append_byte(&out, '}');
		return emit_out(r);
	} else if (strcmp(cmd, "pint") == 0) {
		CHECK(clink_state_get_i64(pf, NULL, 0, &i64));
		clink_buf_reset(&out);
		clink_buf_append_str(&out, "{\"int\":");
		clink_buf_append_i64(&out, i64);
		clink_buf_append_byte(&out, '}');
		return emit_out(r);
	} else if (strcmp(cmd, "pfail") == 0) {
		/* Write and emit, then fail: neither may reach the host. */
		CHECK(clink_state_put(pf, NULL, 0, arg, arg_len));
		emit_str(r, "{\"before\":true}");
		return fail("failed on purpose after a write");
	} else if (strcmp(cmd, "emitmany") == 0) {
		char *sp = strchr(arg, ' ');
		if (sp == NULL)
			return fail("emitmany: want N SIZE");
		*sp = 0;
		int count = (int)atoi64(arg), size = (int)atoi64(sp + 1);
		for (int i = 0; i < count; i++) {
			padded(i, size);
			CHECK(clink_emit(r->key, r->key_len, tmp.data, tmp.len));
		}
	} else if (strcmp(cmd, "emitmix") == 0) {
		/* Small and large records interleaved: order must hold. */
		static const int sizes[] = {4, 70000, 4, 5000, 4};
		for (int i = 0; i < 5; i++) {
			padded(i, sizes[i]);
			CHECK(clink_emit(r->key, r->key_len, tmp.data, tmp.len));
		}
	} else if (strcmp(cmd, "mallocs") == 0) {
		return emit_str(r, "{\"mallocs\":-1}"); /* wasi-libc's malloc keeps no count */
	} else if (strcmp(cmd, "order") == 0) {
		clink_set_resume_order(atoi64(arg));
	} else if (strcmp(cmd, "watermark") == 0) {
		clink_buf_reset(&out);
		clink_buf_append_str(&out, "{\"watermark\":");
		clink_buf_append_i64(&out, clink_watermark());
		clink_buf_append_byte(&out, '}');
		return emit_out(r);
	} else if (strcmp(cmd, "time") == 0) {
		clink_buf_reset(&out);
		clink_buf_append_str(&out, "{\"time\":");
		clink_buf_append_i64(&out, clink_processing_time());
		clink_buf_append_byte(&out, '}');
		return emit_out(r);
	} else if (strcmp(cmd, "log") == 0) {
		clink_logf(CLINK_DEBUG, "debug %s", arg);
		clink_logf(CLINK_INFO, "info %s", arg);
		clink_logf(CLINK_WARN, "warn %s", arg);
		clink_logf(CLINK_ERROR, "error %s", arg);
	} else if (strcmp(cmd, "fail") == 0) {
		clink_logf(CLINK_ERROR, "failed on purpose: %s", arg);
		return 1;
	} else if (strcmp(cmd, "json") == 0 || strcmp(cmd, "unquote") == 0) {
		const uint8_t *raw;
		uint32_t raw_len;
		int found = clink_json_field((const uint8_t *)arg, arg_len, "v", &raw, &raw_len);
		clink_buf_reset(&out);
		if (cmd[0] == 'j') {
			if (!found)
				return emit_str(r, "{\"field\":null}");
			clink_buf_append_str(&out, "{\"field\":");
			clink_buf_append(&out, raw, raw_len);
			clink_buf_append_str(&out, ",\"int\":");
			if (clink_json_parse_int(raw, raw_len, &i64))
				clink_buf_append_i64(&out, i64);
			else
				clink_buf_append_str(&out, "null");
			clink_buf_append_byte(&out, '}');
			return emit_out(r);
		}
		if (!found)
			return emit_str(r, "{\"unquoted\":null}");
		clink_buf_reset(&tmp);
		if (!clink_buf_json_unquote(&tmp, raw, raw_len))
			return emit_str(r, "{\"unquoted\":false}");
		clink_buf_append_str(&out, "{\"unquoted\":");
		clink_buf_json_string(&out, tmp.data, tmp.len);
		clink_buf_append_byte(&out, '}');
		return emit_out(r);
	} else if (strcmp(cmd, "key") == 0) {
		clink_buf_reset(&out);
		clink_buf_append_str(&out, "{\"key\":");
		clink_buf_json_string(&out, r->key, r->key_len);
		clink_buf_append_byte(&out, '}');
		return emit_out(r);
	} else if (strcmp(cmd, "bigemit") == 0) {
		int size = (int)atoi64(arg);
		clink_buf_reset(&out);
		clink_buf_append_byte(&out, '"');
		for (int i = 0; i < size; i++)
			clink_buf_append_byte(&out, 'y');
		clink_buf_append_byte(&out, '"');
		return emit_out(r);
	} else {
		clink_logf(CLINK_ERROR, "unknown command \"%s\"", cmd);
		return 1;
	}
	return 0;
}

/* Key records by their "user" field: a string unquoted, anything else as written. */
int key_of_user(const uint8_t *value, uint32_t len, const uint8_t **key, uint32_t *key_len) {
	const uint8_t *raw;
	uint32_t n;
	if (!clink_json_field(value, len, "user", &raw, &n))
		return 0;
	if (raw[0] != '"') {
		*key = raw;
		*key_len = n;
		return 1;
	}
	clink_buf_reset(&key_buf);
	if (!clink_buf_json_unquote(&key_buf, raw, n))
		return 0;
	*key = key_buf.data;
	*key_len = key_buf.len;
	return 1;
}

void clink_init(void) {
	static const clink_operator op = {process, on_timer, open_op, close_op};
	clink_register("conformance", &op);
	kv = clink_state_new("kv", 0);
	dict = clink_state_new("map", 0);
	big = clink_state_new("big", 0);
	echo = clink_endpoint_new("echo");
	/* Two prefetched states: the second frame's place depends on the first frame's cap. */
	pf = clink_state_new("pf", CLINK_PREFETCH);
	pf2 = clink_state_new("pf2", CLINK_PREFETCH);
}
