package interpose_test

import (
	"testing"

	"github.com/spillway-gpu/spillway/interpose"
)

// TestDriverResult: a driver entry point answers the runtime's code by its
// own number (an error of the device's keeps it), an invalid device pointer
// as CUDA_ERROR_INVALID_VALUE, and a check only the runtime makes as
// CUDA_ERROR_UNKNOWN, never as a driver code of another meaning.
func TestDriverResult(t *testing.T) {
	for _, c := range []struct {
		e    interpose.Error
		want int32
	}{
		{interpose.Success, 0},
		{interpose.ErrorMemoryAllocation, 2},    // CUDA_ERROR_OUT_OF_MEMORY
		{interpose.ErrorInvalidDevicePtr, 1},    // CUDA_ERROR_INVALID_VALUE
		{interpose.ErrorSymbolNotFound, 500},    // CUDA_ERROR_NOT_FOUND
		{interpose.Error(46), 46},               // CUDA_ERROR_DEVICE_UNAVAILABLE
		{interpose.Error(201), 201},             // CUDA_ERROR_INVALID_CONTEXT
		{interpose.Error(700), 700},             // CUDA_ERROR_ILLEGAL_ADDRESS
		{interpose.Error(719), 719},             // CUDA_ERROR_LAUNCH_FAILED
		{interpose.Error(901), 901},             // CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
		{interpose.ErrorInsufficientDrive, 999}, // the runtime's own
		{interpose.Error(9), 999},               // cudaErrorInvalidConfiguration
		{interpose.Error(127), 999},             // cudaErrorStartupFailure
		{interpose.ErrorUnknown, 999},
	} {
		if got := c.e.DriverResult(); got != c.want {
			t.Errorf("%v: CUresult %d, want %d", c.e, got, c.want)
		}
	}
}
