# Spillway: top-level build.
#
# Each part of the tree contributes a fragment under build/*.mk that adds its
# artifacts to `all` and its own steps to `demo`, `bench` and `generate`.
# Outputs go under build/ and are never committed.

GO      ?= go
# make's built-in CC is cc, so `CC ?= gcc` would never apply; the tests compile
# their programs with gcc, and the shim and simcuda are built with the same
# compiler unless CC is given on the command line or in the environment.
ifeq ($(origin CC),default)
CC := gcc
endif
BUILD   := build
TEST_TIMEOUT ?= 30m

export CGO_ENABLED := 1
# go-nvml's cgo sources use declarations its own header marks deprecated.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.PHONY: all test demo bench clean generate
.DEFAULT_GOAL := all

all:

include $(sort $(wildcard build/*.mk))

# Every test: unit tests of the pure-Go packages, the race detector on the
# concurrent ones, and the end-to-end suites under tests/ against simcuda.
test: all
	$(GO) vet ./...
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...
ifneq ($(strip $(RACE_PACKAGES)),)
	$(GO) test -count=1 -race -timeout $(TEST_TIMEOUT) $(RACE_PACKAGES)
endif

# The results are kept in build/bench.txt and summed up, at the end, as the
# README's Performance table, marked as this machine's figures.
bench: all
	{ $(GO) test -run '^$$' -bench . -benchtime 1s $(BENCH_PACKAGES); echo $$? > $(BUILD)/bench.rc; } | tee $(BUILD)/bench.txt
	$(GO) run ./internal/benchsummary $(BUILD)/bench.txt
	@exit $$(cat $(BUILD)/bench.rc)

clean:
	rm -rf $(BUILD)/simcuda $(BUILD)/lib $(BUILD)/bin $(BUILD)/obj $(BUILD)/bench.txt $(BUILD)/bench.rc
