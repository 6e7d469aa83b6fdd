# clink-wasm: targets a newcomer can guess.
#   make build   build bin/clink-wasm
#   make test    the test suite CI runs (starts the S3 test server itself)
#   make race    the concurrent packages under the race detector
#   make bench   benchmarks that print the issue figures (ratios side by side)
#   make lint    gofmt + go vet + staticcheck (pinned)
#   make wasm    rebuild every committed .wasm fixture from source
#   make wasm-check  fail if a committed fixture differs from its source build
#   make fuzz    run each fuzz target for FUZZTIME (default 30s)
#   make s3-up / s3-down   start/stop the loopback S3 server (versitygw) for manual runs
#   make console-test  the web console in headless Chromium (Debian chromium + playwright-core)

GO        ?= go
FUZZTIME  ?= 30s
BENCHTIME ?= 1x
# Packages whose tests exercise concurrency; `make race` runs them with -race.
RACE_PKGS := ./host/... ./internal/...
# The guest SDK is its own module (guest-sdk/go/go.mod); ./... stops at its go.mod, so its
# packages are named by import path (go.mod's replace points them at ./guest-sdk/go).
SDK_PKGS  := github.com/clink-wasm/clink-wasm/guest-sdk/go/...

.PHONY: all build test test-short race bench lint wasm wasm-check fuzz soak s3-up s3-down clean console-test

all: build

build:
	$(GO) build -o bin/clink-wasm ./cmd/clink-wasm

# The README's test command. It needs the loopback S3 server for the state tier's S3 tests:
# scripts/with-s3.sh starts versitygw, runs the command, and stops it.
test:
	AWS_EC2_METADATA_DISABLED=true scripts/with-s3.sh $(GO) test -count=1 ./... $(SDK_PKGS)

test-short:
	$(GO) test -short -count=1 ./... $(SDK_PKGS)

race:
	AWS_EC2_METADATA_DISABLED=true scripts/with-s3.sh $(GO) test -race -count=1 $(RACE_PKGS)

bench:
	AWS_EC2_METADATA_DISABLED=true scripts/with-s3.sh $(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) -count 1 ./host/... | tee bench.out

# staticcheck, pinned. CI installs this version into GOPATH/bin (.ci/run) and passes it in
# STATICCHECK; by default `go run` builds the pinned version (cached after the first time).
STATICCHECK_VERSION := v0.8.2
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./... $(SDK_PKGS)
	$(STATICCHECK) ./... $(SDK_PKGS)

wasm:
	$(MAKE) -C host/abi/testdata
	$(MAKE) -C host/scheduler/testdata
	$(MAKE) -C host/replay/testdata
	scripts/build-wasm.sh

wasm-check:
	scripts/check-wasm.sh

# Every fuzz target, one after the other, FUZZTIME each.
FUZZ_TARGETS := \
	./host/abi:FuzzImports \
	./host/scheduler:FuzzCapturedInput \
	./host/pipeline:FuzzTopLevelField \
	./host/pipeline:FuzzSourceCSV \
	./host/pipeline:FuzzIsJSONNumber \
	./host/pipeline:FuzzParseSpec \
	./internal/jsonfield:FuzzTop \
	./internal/jsonfield:FuzzTopKey \
	./internal/jsonfield:FuzzValid \
	./host/lookup:FuzzParseRequest \
	./host/lookup:FuzzResolvePath \
	./host/lookup/internal/h1:FuzzResponse \
	./host/lookup/internal/h2:FuzzServerFrames \
	./host/state/internal/format:FuzzSegmentDecode \
	./host/state/internal/format:FuzzSeek \
	./host/state/internal/format:FuzzManifestDecode \
	./host/replay:FuzzReadLines \
	./host/replay:FuzzBytes \
	./internal/wasmbin:FuzzInstrument \
	./internal/wasmbin:FuzzInstrumentPrograms \
	./host/server:FuzzDecodeJSON \
	./host/server:FuzzMergePatch

fuzz:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "== $$fn ($$pkg)"; \
		$(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 10s $$pkg || exit 1; \
	done

# Long randomized runs: the scheduler's property tests with hundreds of seeds, the state tier's
# crash test with hundreds of kill points (both under -race), the peak RSS of a runaway guest
# through the CLI (host/abi), and the pipeline crash test. The property tests (300 seeds x 6000
# records, twice, under -race) take about an hour on a loaded 2-core machine: hence 150m.
soak:
	CLINK_SOAK=1 $(GO) test -race -count=1 -run 'TestProperties' -timeout 150m ./host/scheduler/
	# Barrier capture: 300 seeds of a crash at a barrier that captured records, restored from a copy.
	CLINK_SOAK=1 $(GO) test -count=1 -run 'TestCaptureRestore' -timeout 60m ./host/scheduler/
	CLINK_STATE_SOAK=1 AWS_EC2_METADATA_DISABLED=true scripts/with-s3.sh $(GO) test -count=1 -run 'TestCrashRecovery' -timeout 60m ./host/state/
	CLINK_MEM_SOAK=1 $(GO) test -count=1 -run 'TestRunawayGuestRSS' -timeout 10m ./host/abi/
	# Pipelines: 60 crash rounds (>= 60 SIGKILLs) of `run --pipeline`, one and two operators.
	CLINK_SOAK=1 $(GO) test -count=1 -run 'TestPipelineCrash' -timeout 60m ./cmd/clink-wasm/
	# Kafka pipelines: 40 crash rounds (>= 50 SIGKILLs) of `run --pipeline`, Kafka -> counter -> Kafka.
	CLINK_KAFKA_SOAK=1 $(GO) test -count=1 -run 'TestKafkaPipelineCrash' -timeout 30m ./cmd/clink-wasm/
	CLINK_MEM_SOAK=1 $(GO) test -count=1 -run 'TestMemSoak' -timeout 30m -v ./host/scheduler/
	CLINK_KAFKA_SOAK=100 $(GO) test -race -count=1 -run 'TestCrashSoak' -timeout 60m ./host/connector/kafka/
	# Scale-out: 100 chaos rounds of worker processes (SIGKILL, join, leave, SIGSTOP zombies).
	CLINK_WORKER_SOAK=100 AWS_EC2_METADATA_DISABLED=true scripts/with-s3.sh $(GO) test -count=1 -run 'TestWorkerChaos' -timeout 60m -v ./cmd/clink-wasm/

s3-up:
	@scripts/s3-up.sh

s3-down:
	@scripts/s3-down.sh

# The web console in headless Chromium against a real `clink-wasm serve`; screenshots in
# web/test/artifacts/ (or $$ARTIFACTS). Needs /usr/bin/chromium (apt-get install chromium).
console-test: build
	cd web/test && npm ci --no-audit --no-fund --loglevel=error
	CLINK_BIN=$(CURDIR)/bin/clink-wasm node web/test/console.test.mjs

clean:
	rm -rf bin bench.out
