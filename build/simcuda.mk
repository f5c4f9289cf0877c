# simcuda: the simulated CUDA driver and runtime (NVML: build/simcuda-nvml.mk).
#   build/simcuda/libcuda.so.1      driver, soname libcuda.so.1
#   build/simcuda/libcudart.so.12   runtime, soname libcudart.so.12; never links the driver
#   build/simcuda/libcudart_static.a  the runtime for static linking (needs -ldl -lpthread)
# and the link names libcuda.so, libcudart.so beside them.
# The driver binds its own functions directly (-Bsymbolic-functions): the pointers
# cuGetProcAddress hands out are the driver's, whatever else defines those names.

SIMCUDA_DIR := $(BUILD)/simcuda
SIMCUDA_OBJ := $(BUILD)/obj/simcuda
SIMCUDA_CFLAGS := -std=c11 -O2 -g -Wall -Wextra -Werror -fPIC -pthread -fvisibility=hidden \
	-Iinterpose/include
SIMCUDA_HEADERS := $(wildcard tests/simcuda/*.h) $(wildcard interpose/include/spillway/*.h) \
	build/simcuda.mk
SIMCUDA_DRIVER_SRCS := tests/simcuda/driver.c tests/simcuda/memory.c tests/simcuda/streams.c \
	tests/simcuda/devices.c tests/simcuda/state.c tests/simcuda/vmm.c tests/simcuda/arrays.c

.PHONY: simcuda demo-simcuda
all: simcuda
simcuda: $(SIMCUDA_DIR)/libcuda.so.1 $(SIMCUDA_DIR)/libcuda.so \
	$(SIMCUDA_DIR)/libcudart.so.12 $(SIMCUDA_DIR)/libcudart.so $(SIMCUDA_DIR)/libcudart_static.a

$(SIMCUDA_DIR)/libcuda.so.1: $(SIMCUDA_DRIVER_SRCS) $(SIMCUDA_HEADERS)
	@mkdir -p $(@D)
	$(CC) $(SIMCUDA_CFLAGS) -shared -Wl,-soname,libcuda.so.1 -Wl,-z,defs -Wl,-Bsymbolic-functions \
		-o $@ $(SIMCUDA_DRIVER_SRCS) -pthread

$(SIMCUDA_DIR)/libcudart.so.12: tests/simcuda/runtime.c $(SIMCUDA_HEADERS)
	@mkdir -p $(@D)
	$(CC) $(SIMCUDA_CFLAGS) -shared -Wl,-soname,libcudart.so.12 -Wl,-z,defs \
		-o $@ tests/simcuda/runtime.c -ldl -pthread

$(SIMCUDA_OBJ)/runtime.o: tests/simcuda/runtime.c $(SIMCUDA_HEADERS)
	@mkdir -p $(@D)
	$(CC) $(SIMCUDA_CFLAGS) -c -o $@ tests/simcuda/runtime.c

$(SIMCUDA_DIR)/libcudart_static.a: $(SIMCUDA_OBJ)/runtime.o
	@mkdir -p $(@D)
	rm -f $@
	$(AR) rcs $@ $<

$(SIMCUDA_DIR)/libcuda.so: $(SIMCUDA_DIR)/libcuda.so.1
	ln -sf libcuda.so.1 $@

$(SIMCUDA_DIR)/libcudart.so: $(SIMCUDA_DIR)/libcudart.so.12
	ln -sf libcudart.so.12 $@

# `make demo-simcuda` runs a sample application on simcuda (`make demo` is the shim's story).
demo-simcuda: simcuda
	BUILD=$(BUILD) CC=$(CC) sh build/simcuda-demo.sh
