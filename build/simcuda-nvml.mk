# simcuda's NVML: build/simcuda/libnvidia-ml.so.1 and its link name.
# Independent of the simulated driver, as the real NVML is; it shares only the
# device configuration parser and the state folder code with it.

SIMCUDA_NVML_SRCS := tests/simcuda/nvml.c tests/simcuda/state.c tests/simcuda/devices.c
SIMCUDA_NVML_DEPS := $(SIMCUDA_NVML_SRCS) tests/simcuda/state.h tests/simcuda/devices.h \
	interpose/include/spillway/nvml.h build/simcuda-nvml.mk
SIMCUDA_NVML_CFLAGS := -std=c11 -O2 -g -Wall -Wextra -Werror -fPIC -fvisibility=hidden \
	-Iinterpose/include

.PHONY: simcuda-nvml
all: simcuda-nvml
simcuda: simcuda-nvml
simcuda-nvml: $(BUILD)/simcuda/libnvidia-ml.so.1 $(BUILD)/simcuda/libnvidia-ml.so

$(BUILD)/simcuda/libnvidia-ml.so.1: $(SIMCUDA_NVML_DEPS)
	@mkdir -p $(@D)
	$(CC) $(SIMCUDA_NVML_CFLAGS) -shared -Wl,-soname,libnvidia-ml.so.1 -Wl,-z,defs \
		-o $@ $(SIMCUDA_NVML_SRCS) -pthread

$(BUILD)/simcuda/libnvidia-ml.so: $(BUILD)/simcuda/libnvidia-ml.so.1
	ln -sf libnvidia-ml.so.1 $@

BENCH_PACKAGES += ./tests/simcudatest/
