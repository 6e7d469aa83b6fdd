//go:build unix && !linux

package uring

func maxConcurrency(r *Reactor) int64 { return r.e.(*poolEngine).maxRunning.Load() }
