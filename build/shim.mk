# The shim: the preloaded C front (build/lib/libspillway.so), the Go core it
# loads at the first CUDA call (build/lib/libspillway-core.so), and the
# spillway command (build/bin/spillway).

SHIM_FRONT_SRCS := shim/front/front.c shim/front/real.c shim/front/runtime.c shim/front/driver.c \
	shim/front/streams.c shim/front/pools.c shim/front/contexts.c shim/front/vmm.c \
	shim/front/arrays.c shim/front/nvml.c shim/front/dlsym.c
SHIM_FRONT_DEPS := $(SHIM_FRONT_SRCS) $(wildcard shim/front/*.h) shim/core/abi.h interpose/real.h \
	interpose/calls.h interpose/probes.h $(wildcard interpose/include/spillway/*.h) build/shim.mk
SHIM_FRONT_CFLAGS := -std=c11 -O2 -g -Wall -Wextra -Werror -fPIC -fvisibility=hidden \
	-Iinterpose/include -Iinterpose -Ishim/core

# Go sources of the core and the command, so that make rebuilds on any change.
SHIM_CORE_DEPS := $(wildcard shim/core/*.go shim/core/*.c shim/core/*.h shim/core/*.map shim/config/*.go \
	internal/devmem/*.go internal/stat/*.go interpose/*.go interpose/*.h pool/*.go interpose/include/spillway/*.h) \
	go.mod build/shim.mk
SHIM_CMD_DEPS := $(wildcard cmd/spillway/*.go shim/config/*.go internal/stat/*.go bpf/*.go bpf/*.o) go.mod \
	build/shim.mk

.PHONY: shim shim-front shim-core spillway-cmd
all: shim spillway-cmd
shim: shim-front shim-core
shim-front: $(BUILD)/lib/libspillway.so
shim-core: $(BUILD)/lib/libspillway-core.so
spillway-cmd: $(BUILD)/bin/spillway

$(BUILD)/lib/libspillway.so: $(SHIM_FRONT_DEPS)
	@mkdir -p $(@D)
	$(CC) $(SHIM_FRONT_CFLAGS) -shared -Wl,-soname,libspillway.so -Wl,-z,defs \
		-o $@ $(SHIM_FRONT_SRCS) -ldl -lpthread

# The version script keeps the Go runtime's cgo helpers out of the dynamic
# symbol table: the core exports spillway_core_* and nothing else.
$(BUILD)/lib/libspillway-core.so: $(SHIM_CORE_DEPS)
	@mkdir -p $(@D)
	$(GO) build -buildmode=c-shared \
		-ldflags='-extldflags=-Wl,--version-script=$(CURDIR)/shim/core/exports.map' \
		-o $@ ./shim/core
	rm -f $(BUILD)/lib/libspillway-core.h

$(BUILD)/bin/spillway: $(SHIM_CMD_DEPS)
	@mkdir -p $(@D)
	$(GO) build -o $@ ./cmd/spillway

BENCH_PACKAGES += ./tests/shimtest/ ./internal/stat/ ./internal/devmem/
RACE_PACKAGES += ./shim/core/ ./internal/devmem/ ./internal/stat/ ./cmd/spillway/

# `make demo`: a job larger than its quota, pooled, spilled and promoted on simcuda.
.PHONY: demo-shim
demo: demo-shim
demo-shim: simcuda shim spillway-cmd
	BUILD=$(BUILD) CC=$(CC) sh build/demo.sh
