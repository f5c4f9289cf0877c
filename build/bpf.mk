# Tracing: the eBPF probes in bpf/. Their compiled objects and Go bindings
# (bpf/spillway_x86_bpfel.{o,go}) are committed, so building and testing need
# no clang; `make generate` rebuilds them with clang and bpf2go (the version
# in go.mod) after a change to bpf/*.c or bpf/*.h.

BPF_GENERATE_PACKAGES := clang llvm libbpf-dev

.PHONY: bpf-generate
generate: bpf-generate
bpf-generate:
	@missing=; for p in $(BPF_GENERATE_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing$$missing for bpf2go"; \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	cd bpf && $(GO) generate ./

BENCH_PACKAGES += ./tests/tracetest/
RACE_PACKAGES += ./bpf/
