//go:build !wasip1

package abi

import (
	"math"
	"strconv"
	"unsafe"
)

// In a native build the imports are served by Host, a single-threaded in-memory host that
// follows docs/abi.md closely enough to unit-test operators (package clinktest drives it). It
// is not the production host: it has no limits, no suspension and no sandbox.

// Call says which export the native host is currently inside; imports check it the way the
// real host does (NOT_ALLOWED outside a key context, and so on).
type Call int

const (
	CallNone Call = iota
	CallManifest
	CallOpen
	CallClose
	CallProcess
	CallTimer
	CallKey
)

// Output is one emitted record.
type Output struct {
	Key, Value []byte
	Timestamp  int64
	Rec        int // the batch record that emitted it (0 outside a batch call)
}

// LogLine is one log call.
type LogLine struct {
	Level int32
	Msg   string
}

// LookupFunc answers a lookup: status > 0 and a body, or code < 0 (a LOOKUP_* code).
type LookupFunc func(endpoint int, request []byte) (status int, body []byte, code int32)

// NativeHost is the state of the in-memory host.
type NativeHost struct {
	Call      Call
	Key       string // record key of the current call
	Timestamp int64  // timestamp of the current record or timer

	NumStates, NumEndpoints int
	Prefetch                []uint32                       // state indices, in manifest prefetch order
	State                   map[string][]map[string][]byte // record key -> state index -> entry -> value
	Timers                  map[string]map[int64]bool      // record key -> timestamps
	ProcTimers              map[string]map[int64]bool      // record key -> processing times
	WatermarkValue          int64
	Outputs                 []Output
	Logs                    []LogLine
	Lookups                 LookupFunc
	ResumeOrder             int64 // last set_resume_order of the current call

	pending    []byte
	hasPending bool

	// Batch is the clink_process_batch call in progress (docs/abi.md, "Batch calls"), nil
	// outside one: every import serves the record the input buffer's header names.
	Batch *NativeBatch

	area  []byte // registered output area (a view of guest memory), nil when none
	fault string // set by a drain that found a malformed area: the call faults
}

// NativeBatch is what the native host knows of a batch call: each record's key and timestamp,
// the record it serves, and how far the output area was delivered.
type NativeBatch struct {
	Keys []string
	TS   []int64
	// Cur is the record the host serves: the header's current as the last import read it.
	Cur int
	// Done is how many records' outputs were delivered (by a flush_output); Pos is where in
	// the area the next undelivered record starts.
	Done int
	Pos  uint32
}

// serve makes the host serve the batch record that the header's current names (outside a
// batch call it does nothing). A current that moves back or past the batch is a fault, as in
// the real host; the host then keeps serving the record it was on.
func (h *NativeHost) serve() {
	b := h.Batch
	if b == nil {
		return
	}
	c := int(Le32(Input[4:]))
	if c == b.Cur {
		return
	}
	if c < b.Cur || c >= len(b.Keys) {
		h.fault = "the batch header's current record moved from " + strconv.Itoa(b.Cur) + " to " + strconv.Itoa(c)
		return
	}
	b.Cur = c
	h.Key, h.Timestamp = b.Keys[c], b.TS[c]
}

// Host is the native host every import talks to.
var Host = NewNativeHost()

// NewNativeHost returns an empty host with the watermark at its initial value.
func NewNativeHost() *NativeHost {
	return &NativeHost{
		State:          map[string][]map[string][]byte{},
		Timers:         map[string]map[int64]bool{},
		ProcTimers:     map[string]map[int64]bool{},
		WatermarkValue: math.MinInt64,
	}
}

func bytesAt(p unsafe.Pointer, n uint32) []byte {
	if n == 0 || p == nil {
		return nil
	}
	return unsafe.Slice((*byte)(p), n)
}

func (h *NativeHost) keyed() bool {
	h.serve()
	return h.Call == CallProcess || h.Call == CallTimer
}

func (h *NativeHost) entries(state uint32) (map[string][]byte, int32) {
	if !h.keyed() {
		return nil, NotAllowed
	}
	if int(state) >= h.NumStates {
		return nil, InvalidArgument
	}
	return h.entriesOf(state), 0
}

// entriesOf is the current key's map of state, created if needed.
func (h *NativeHost) entriesOf(state uint32) map[string][]byte {
	s := h.State[h.Key]
	if s == nil {
		s = make([]map[string][]byte, h.NumStates)
		h.State[h.Key] = s
	}
	if s[state] == nil {
		s[state] = map[string][]byte{}
	}
	return s[state]
}

func (h *NativeHost) deliver(v []byte, bufPtr unsafe.Pointer, bufCap uint32) {
	h.pending, h.hasPending = nil, false
	if uint32(len(v)) <= bufCap {
		copy(bytesAt(bufPtr, bufCap), v)
		return
	}
	h.pending, h.hasPending = append([]byte(nil), v...), true
}

func GetAsync(state uint32, keyPtr unsafe.Pointer, keyLen uint32, bufPtr unsafe.Pointer, bufCap uint32) int32 {
	h := Host
	h.pending, h.hasPending = nil, false
	m, rc := h.entries(state)
	if rc != 0 {
		return rc
	}
	v, ok := m[string(bytesAt(keyPtr, keyLen))]
	if !ok {
		return NotFound
	}
	h.deliver(v, bufPtr, bufCap)
	return int32(len(v))
}

func Put(state uint32, keyPtr unsafe.Pointer, keyLen uint32, valPtr unsafe.Pointer, valLen uint32) int32 {
	m, rc := Host.entries(state)
	if rc != 0 {
		return rc
	}
	m[string(bytesAt(keyPtr, keyLen))] = append([]byte{}, bytesAt(valPtr, valLen)...)
	return 0
}

func Delete(state uint32, keyPtr unsafe.Pointer, keyLen uint32) int32 {
	m, rc := Host.entries(state)
	if rc != 0 {
		return rc
	}
	delete(m, string(bytesAt(keyPtr, keyLen)))
	return 0
}

func TakeResult(bufPtr unsafe.Pointer, bufCap uint32) int32 {
	h := Host
	if !h.hasPending {
		return NoResult
	}
	if uint32(len(h.pending)) > bufCap {
		return BufferTooSmall
	}
	n := copy(bytesAt(bufPtr, bufCap), h.pending)
	h.pending, h.hasPending = nil, false
	return int32(n)
}

func Emit(keyPtr unsafe.Pointer, keyLen uint32, valPtr unsafe.Pointer, valLen uint32) int32 {
	h := Host
	if h.Call != CallProcess && h.Call != CallTimer && h.Call != CallClose {
		return NotAllowed
	}
	h.serve()
	h.output(bytesAt(keyPtr, keyLen), bytesAt(valPtr, valLen))
	return 0
}

func TimerRegister(timestamp int64) int32 {
	h := Host
	if !h.keyed() {
		return NotAllowed
	}
	t := h.Timers[h.Key]
	if t == nil {
		t = map[int64]bool{}
		h.Timers[h.Key] = t
	}
	t[timestamp] = true
	return 0
}

func TimerDelete(timestamp int64) int32 {
	h := Host
	if !h.keyed() {
		return NotAllowed
	}
	delete(h.Timers[h.Key], timestamp)
	return 0
}

func ProcTimerRegister(timestamp int64) int32 {
	h := Host
	if !h.keyed() {
		return NotAllowed
	}
	t := h.ProcTimers[h.Key]
	if t == nil {
		t = map[int64]bool{}
		h.ProcTimers[h.Key] = t
	}
	t[timestamp] = true
	return 0
}

func ProcTimerDelete(timestamp int64) int32 {
	h := Host
	if !h.keyed() {
		return NotAllowed
	}
	delete(h.ProcTimers[h.Key], timestamp)
	return 0
}

func Watermark() int64 { return Host.WatermarkValue }

// ProcessingTime is fixed in the native host so that tests are deterministic; clinktest can
// change it.
var NativeProcessingTime int64

func ProcessingTime() int64 { return NativeProcessingTime }

func Log(level int32, msgPtr unsafe.Pointer, msgLen uint32) {
	if level < 0 || level > 3 {
		level = 3
	}
	Host.Logs = append(Host.Logs, LogLine{Level: level, Msg: string(bytesAt(msgPtr, msgLen))})
}

func Lookup(endpoint uint32, reqPtr unsafe.Pointer, reqLen uint32, bufPtr unsafe.Pointer, bufCap uint32) int64 {
	h := Host
	h.pending, h.hasPending = nil, false
	if h.Call == CallManifest || h.Call == CallKey {
		return NotAllowed
	}
	if int(endpoint) >= h.NumEndpoints {
		return InvalidArgument
	}
	if h.Lookups == nil {
		return LookupUnavailable
	}
	status, body, code := h.Lookups(int(endpoint), append([]byte{}, bytesAt(reqPtr, reqLen)...))
	if code < 0 {
		return int64(code)
	}
	h.deliver(body, bufPtr, bufCap)
	return int64(status)<<32 | int64(uint32(len(body)))
}

// OutputArea registers memory[ptr, ptr+capacity) as the output area (docs/abi.md, "The
// output area"), draining the previous one first.
func OutputArea(ptr unsafe.Pointer, capacity uint32) int32 {
	h := Host
	if h.Call == CallManifest || h.Call == CallKey {
		return NotAllowed
	}
	if capacity != 0 && capacity < 8 || capacity == 0 && ptr != nil {
		return InvalidArgument
	}
	h.Drain()
	h.area = bytesAt(ptr, capacity)
	return 0
}

// output delivers an emitted record of the current call (of the record served, in a batch).
func (h *NativeHost) output(k, v []byte) {
	o := Output{Key: append([]byte{}, k...), Value: append([]byte{}, v...), Timestamp: h.Timestamp}
	if h.Batch != nil {
		o.Rec = h.Batch.Cur
	}
	h.Outputs = append(h.Outputs, o)
}

// FlushOutput drains the output area now. In a batch call the area's records up to each
// earlier record's out_end go to that record, and the rest to the record served.
func FlushOutput() int32 {
	h := Host
	if h.Call != CallProcess && h.Call != CallTimer && h.Call != CallClose {
		return NotAllowed
	}
	h.serve()
	if b := h.Batch; b != nil {
		cur := b.Cur
		h.DrainBatch(cur)
		b.Cur = cur
		h.Key, h.Timestamp = b.Keys[cur], b.TS[cur]
	}
	h.Drain()
	return 0
}

// Drain delivers the records in the output area, as if each had been passed to emit, and
// empties it. A malformed area sets Fault (the real host faults the call).
func (h *NativeHost) Drain() {
	if len(h.area) == 0 {
		return
	}
	used := Le32(h.area)
	if uint64(used) > uint64(len(h.area)-4) {
		h.fault = "output area: used exceeds cap - 4"
		return
	}
	pos := uint32(0)
	if h.Batch != nil {
		pos = h.Batch.Pos
	}
	h.drainTo(pos, used)
	if h.Batch != nil {
		h.Batch.Pos = 0
	}
	PutLe32(h.area, 0)
}

// DrainBatch delivers, for each batch record from the first undelivered one up to (not
// including) upto, the output area's records up to the record's out_end (docs/abi.md, "Batch
// calls"), leaving the area's used as it is. A malformed out_end sets Fault.
func (h *NativeHost) DrainBatch(upto int) {
	b := h.Batch
	if len(h.area) == 0 {
		b.Done = upto
		return
	}
	used := Le32(h.area)
	for ; b.Done < upto; b.Done++ {
		end := Le32(Input[BatchHeader+BatchDesc*b.Done+DescOutEnd:])
		if end < b.Pos || end > used || uint64(used) > uint64(len(h.area)-4) {
			h.fault = "batch record " + strconv.Itoa(b.Done) + ": out_end outside the output area's records"
			return
		}
		b.Cur = b.Done
		h.Timestamp = b.TS[b.Done]
		if !h.drainTo(b.Pos, end) {
			return
		}
		b.Pos = end
	}
}

// drainTo delivers the output area's records in [from, to) of its data (after the used
// word), reporting false (and setting Fault) when one runs past to.
func (h *NativeHost) drainTo(from, to uint32) bool {
	recs := h.area[4+from : 4+to]
	for len(recs) > 0 {
		if len(recs) < RecordHeader {
			h.fault = "output area: a record runs past used"
			return false
		}
		kl, vl := uint64(Le32(recs)), uint64(Le32(recs[4:]))
		if RecordHeader+kl+vl > uint64(len(recs)) {
			h.fault = "output area: a record runs past used"
			return false
		}
		h.output(recs[RecordHeader:RecordHeader+kl], recs[RecordHeader+kl:RecordHeader+kl+vl])
		recs = recs[RecordHeader+kl+vl:]
	}
	return true
}

// DiscardOutput empties the output area without delivering it: the real host discards a
// faulted instance together with its undrained records.
func (h *NativeHost) DiscardOutput() {
	if len(h.area) >= 4 {
		PutLe32(h.area, 0)
	}
}

// AreaUsed is the output area's used word (0 without an area).
func (h *NativeHost) AreaUsed() uint32 {
	if len(h.area) < 4 {
		return 0
	}
	return Le32(h.area)
}

// Fault makes the current call fault with msg, unless it already has a fault.
func (h *NativeHost) Fault(msg string) {
	if h.fault == "" {
		h.fault = msg
	}
}

// TakeFault returns and clears the fault a drain or a write-back found.
func (h *NativeHost) TakeFault() string {
	f := h.fault
	h.fault = ""
	return f
}

// FrameCap is the value area the native host reserves for a value of n bytes (absent: n < 0):
// the smallest the ABI allows, so that tests reach the "larger than the frame" path easily.
func FrameCap(n int) uint32 { return max(FrameMinCap, Align8(uint32(max(n, 0)))) }

// Frames returns the prefetch frames for the current key (h.Key), laid out as the host
// writes them into the input buffer after the record, and their value areas' sizes, which
// WriteBack trusts rather than the headers the guest could change.
func (h *NativeHost) Frames() (b []byte, caps []uint32) {
	for _, st := range h.Prefetch {
		v, found := h.State[h.Key], false
		var val []byte
		if v != nil && v[st] != nil {
			val, found = v[st][""]
		}
		n := uint32(FrameAbsent)
		if found {
			n = uint32(len(val))
		}
		c := FrameCap(len(val))
		caps = append(caps, c)
		hdr := make([]byte, FrameHeader+c)
		PutLe32(hdr, n)
		PutLe32(hdr[4:], c)
		copy(hdr[FrameHeader:], val)
		b = append(b, hdr...)
	}
	return b, caps
}

// WriteBack applies the DIRTY frames in frames (a view of the input buffer after the call,
// with the caps Frames returned) as puts and deletes of entry "" of the current key, in
// prefetch order.
func (h *NativeHost) WriteBack(frames []byte, caps []uint32) {
	for i, st := range h.Prefetch {
		c := caps[i]
		n, flags := Le32(frames), Le32(frames[8:])
		if flags&FrameDirty != 0 {
			m := h.entriesOf(st)
			switch {
			case n == FrameAbsent:
				delete(m, "")
			case n > c:
				h.fault = "prefetch frame: DIRTY with len > cap"
				return
			default:
				m[""] = append([]byte{}, frames[FrameHeader:FrameHeader+n]...)
			}
		}
		frames = frames[FrameHeader+c:]
	}
}

func SetResumeOrder(order int64) {
	if Host.keyed() {
		Host.ResumeOrder = order
	}
}
