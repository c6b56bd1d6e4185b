// C launchers of the sharding family's CUDA kernels. Plain C so that the .cu
// files compile without TensorFlow headers and so that the GPU test harness
// can call them through ctypes.
#ifndef SOK_GRAPH_TF_OPS_SHARDING_KERNELS_LOCAL_ROWS_LAUNCHER_H_
#define SOK_GRAPH_TF_OPS_SHARDING_KERNELS_LOCAL_ROWS_LAUNCHER_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// out[i] = ids[i] / world_size on `stream` (a cudaStream_t; NULL for the
// default stream). Negative ids give -1 and, when device_negative_count (a
// device int64 the caller zeroes) is not NULL, are counted there. Returns a cudaError_t: 0 on
// success, nonzero when the launch failed (e.g. no CUDA device).
int sok_local_rows_int32(const int32_t* ids, int64_t n, int64_t world_size, int32_t* out,
                         int64_t* device_negative_count, void* stream);
int sok_local_rows_int64(const int64_t* ids, int64_t n, int64_t world_size, int64_t* out,
                         int64_t* device_negative_count, void* stream);

#ifdef __cplusplus
}
#endif

#endif  // SOK_GRAPH_TF_OPS_SHARDING_KERNELS_LOCAL_ROWS_LAUNCHER_H_
