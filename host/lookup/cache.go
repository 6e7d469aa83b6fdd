package lookup

import (
	"container/list"
	"sync"
	"time"
)

// cache is an endpoint's response cache: LRU bounded by entries and body bytes, with a TTL
// checked on read. Responses are immutable once stored, so a hit hands out the stored body
// without copying (Response.Body is read-only by contract).
type cache struct {
	ttl        time.Duration
	maxEntries int
	maxBytes   int64
	methods    [len(methods)]bool
	statuses   statusSet

	mu    sync.Mutex
	m     map[string]*list.Element // guarded by mu
	lru   list.List                // of *cacheEntry, most recent first; guarded by mu
	bytes int64                    // guarded by mu
}

type cacheEntry struct {
	key     string
	resp    Response
	expires time.Time
}

func newCache(c *CacheConfig) *cache {
	st, _ := parseStatusSet(c.Statuses) // validated
	return &cache{
		ttl: time.Duration(c.TTL), maxEntries: c.MaxEntries, maxBytes: c.MaxBytes,
		methods: methodSet(c.Methods), statuses: st, m: make(map[string]*list.Element),
	}
}

func (c *cache) cacheable(method string) bool {
	i := methodIndex(method)
	return i >= 0 && c.methods[i]
}

func (c *cache) get(key string) (Response, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.m[key]
	if !ok {
		return Response{}, false
	}
	ent := el.Value.(*cacheEntry)
	if time.Now().After(ent.expires) {
		c.removeLocked(el)
		return Response{}, false
	}
	c.lru.MoveToFront(el)
	return ent.resp, true
}

func (c *cache) put(key string, r Response) {
	if r.Err != nil || !c.statuses.has(r.Status) || int64(len(r.Body)) > c.maxBytes/4 {
		return // one entry may take at most a quarter of the budget
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.m[key]; ok {
		c.removeLocked(el)
	}
	ent := &cacheEntry{key: key, resp: r, expires: time.Now().Add(c.ttl)}
	c.m[key] = c.lru.PushFront(ent)
	c.bytes += int64(len(r.Body) + len(key))
	for c.lru.Len() > c.maxEntries || c.bytes > c.maxBytes {
		c.removeLocked(c.lru.Back())
	}
}

func (c *cache) removeLocked(el *list.Element) {
	ent := c.lru.Remove(el).(*cacheEntry)
	delete(c.m, ent.key)
	c.bytes -= int64(len(ent.resp.Body) + len(ent.key))
}

func (c *cache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}
