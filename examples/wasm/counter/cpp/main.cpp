// counter, in C++ over the same header-only SDK: counts records per key and emits
// {"key":K,"count":N} per record.
//
//   clang++ --target=wasm32-wasi -O2 -fno-exceptions -nostdlib++ -mexec-model=reactor \
//       -I ../../../../guest-sdk/c -o counter-cpp.wasm main.cpp
//
// -nostdlib++: the SDK needs only the C library; link Debian's libc++-14-dev-wasm32 instead
// if the operator uses the C++ standard library.
#include "clink.h"

namespace {

// A small RAII wrapper over clink_buf, the kind of helper a C++ operator would write.
class Json {
  public:
	Json() : b_() {}
	~Json() { clink_buf_free(&b_); }
	Json(const Json &) = delete;
	Json &operator=(const Json &) = delete;

	Json &reset() { clink_buf_reset(&b_); return *this; }
	Json &raw(const char *s) { clink_buf_append_str(&b_, s); return *this; }
	Json &str(const uint8_t *s, uint32_t n) { clink_buf_json_string(&b_, s, n); return *this; }
	Json &num(int64_t v) { clink_buf_append_i64(&b_, v); return *this; }
	const uint8_t *data() const { return b_.data; }
	uint32_t size() const { return b_.len; }

  private:
	clink_buf b_;
};

// Prefetched: the count travels with the record, so the hot path makes no import call.
clink_state *counts;
Json out;

int process(const clink_record *r) {
	int64_t n;
	if (int32_t rc = clink_state_get_i64(counts, nullptr, 0, &n); rc < 0)
		return rc;
	if (int32_t rc = clink_state_put_i64(counts, nullptr, 0, ++n); rc < 0)
		return rc;
	out.reset().raw("{\"key\":").str(r->key, r->key_len).raw(",\"count\":").num(n).raw("}");
	return clink_emit(r->key, r->key_len, out.data(), out.size());
}

} // namespace

extern "C" void clink_init(void) {
	static const clink_operator op = {process, nullptr, nullptr, nullptr};
	clink_register("counter", &op);
	counts = clink_state_new("count", CLINK_PREFETCH);
}
