package bpf

// The generated spillway_x86_bpfel.{go,o} are committed so that building needs
// no clang; `make generate` regenerates them. They were made with Debian clang
// 14.0.6, libbpf-dev 1.1.2 headers and bpf2go from github.com/cilium/ebpf v0.22.0.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -target amd64 -type event spillway spillway.bpf.c -- -I/usr/include/x86_64-linux-gnu -O2 -g -Wall -Werror
