package scheduler

// OrderInput: outputs held until every earlier record is done.

// heldOutput holds a record's outputs in OrderInput mode until every earlier record is done.
type heldOutput struct {
	done bool
	outs []Output // owned copies
}

func (h *heldOutput) add(key, value []byte, ts int64, src Source) {
	kv := make([]byte, 0, len(key)+len(value)+len(src.Key))
	kv = append(append(append(kv, key...), value...), src.Key...)
	src.Key = kv[len(key)+len(value):]
	h.outs = append(h.outs, Output{Kind: OutputData, Key: kv[:len(key):len(key)], Value: kv[len(key) : len(key)+len(value)], TS: ts, Src: src})
}

// releaseHeld passes on the outputs of the longest prefix of completed records.
func (c *Controller) releaseHeld() {
	n := 0
	for ; n < len(c.reorder) && c.reorder[n].done; n++ {
		for _, o := range c.reorder[n].outs {
			if err := c.out.emit(o.Key, o.Value, o.TS, o.Src); err != nil {
				c.fail(err)
			}
		}
		c.reorder[n] = nil
	}
	c.reorder = c.reorder[n:]
}
