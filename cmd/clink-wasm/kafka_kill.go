package main

import (
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/clink-wasm/clink-wasm/host/connector/kafka"
)

// installKafkaKillHook is the Kafka part of the crash test's fault injection:
// CLINK_TEST_KILL_AT=decide-partial:N SIGKILLs the process in the middle of the Nth decision
// of a Kafka exactly-once sink, right after its subtask 0's transaction committed (the
// other subtasks' commits, running beside it, may or may not have gone through).
func installKafkaKillHook() {
	phase, ns, ok := strings.Cut(os.Getenv("CLINK_TEST_KILL_AT"), ":")
	n, err := strconv.Atoi(ns)
	if !ok || err != nil || n < 1 || phase != "decide-partial" {
		return
	}
	var seen atomic.Int64
	kafka.SetDecideHook(func(_ uint64, subtask int) {
		if subtask == 0 && seen.Add(1) == int64(n) {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	})
}
