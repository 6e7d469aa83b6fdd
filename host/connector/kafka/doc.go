// Package kafka is the pipeline's Kafka connector: a source with per-partition positions
// and watermarks, and a sink that writes exactly once through transactions (or at least
// once), with the recovery that decides, after a crash, whether a checkpoint rolls forward
// or back. It uses franz-go and is tested against franz-go's in-process cluster, kfake,
// which also backs `clink-wasm dev kafka` (StartDev).
//
// # How it maps onto the pipeline runtime
//
// Register (and RegisterHosted, for a multi-tenant server) adds `type: kafka` sources and sinks
// to a pipeline.Connectors; pipeline.go adapts the types below onto the runtime's connector
// interfaces, the exactly-once sink being a pipeline.DecidingSink. The core API underneath:
//
// Source side, per source subtask:
//
//	splits  := src.Splits(ctx)               // every partition of the topics / pattern
//	mine    := Assign(splits, i, parallelism) // or the consumer group's assignment (scale-out)
//	src.Open(ctx, mine, restored.Positions)   // the checkpoint's offsets, never the group's
//	recs    := src.Poll(ctx, wait, max)       // Record{Split, Offset, Key, Value, Time, Err}
//	wm, idle := src.Watermark()               // min over active partitions; SplitWatermark(s)
//	pos     := src.Positions()                // the source's part of checkpoint n
//	src.AddSplits / src.RemoveSplits          // assignment changes; a revoked split hands
//	                                          // over its position
//
// Sink side, per sink subtask, with epoch n = checkpoint n:
//
//	Recover(ctx, RecoverInput{...})            // once per restore, before any sink exists
//	s := NewSink(ctx, cfg, Identity{job, sink, i, p}, restoredEpoch+1) // fences the last incarnation
//	s.Write(ctx, out)                          // never waits for a checkpoint
//	prep := s.PreCommit(ctx, Marker{n, ...})    // on barrier n: into the pending manifest
//	s.Commit(ctx, n)                           // after the state delta and the pending manifest
//	                                           // are durable, before manifest n is committed
//
// The order of an epoch, the recovery rule and its table of crash points are in
// docs/DESIGN.md, "Kafka exactly once".
//
// # Errors
//
// Every error is an *Error whose Kind is one of the sentinels (ErrUnreachable,
// ErrMissingTopic, ErrAuthentication, ErrAuthorization, ErrFenced, ErrTransactionAborted,
// ErrPartialCommit, ErrInvariant, ErrConfig) and which says whether retrying can help
// (IsRetryable).
//
// # Notes
//
// Configuration blocks (Config, SourceConfig, SinkConfig) decode from a pipeline spec (json
// and yaml tags) and never hold a secret: SASL passwords come from the environment variable
// that sasl.password_env names.
package kafka
