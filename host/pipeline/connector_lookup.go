package pipeline

// SourceFactoryOf returns the factory registered for a source type (nil if none): a scale-out
// worker wraps it to restrict a source to the splits it owns.
func (c *Connectors) SourceFactoryOf(typ string) SourceFactory {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sources[typ]
}
