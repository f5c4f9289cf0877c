module github.com/spillway-gpu/spillway

go 1.26.0

require (
	github.com/NVIDIA/go-nvml v0.13.4-1
	github.com/cilium/ebpf v0.22.0
	github.com/sirupsen/logrus v1.10.2
	golang.org/x/sys v0.50.0
)
