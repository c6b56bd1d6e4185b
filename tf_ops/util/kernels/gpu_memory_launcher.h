// Small device-memory helpers for the GPU OpKernels, as C functions so that
// the kernels' .cc files need neither CUDA headers nor the stream executor's
// copy API (which changed between the TensorFlow versions sok_graph builds
// against). Each takes the op's stream (a cudaStream_t) and returns a
// cudaError_t (0 on success).
#ifndef SOK_GRAPH_TF_OPS_UTIL_KERNELS_GPU_MEMORY_LAUNCHER_H_
#define SOK_GRAPH_TF_OPS_UTIL_KERNELS_GPU_MEMORY_LAUNCHER_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// The number of CUDA devices this process sees (0 without a driver), or a
// negative cudaError_t. Lets callers check CUDA is usable before launching.
int sok_cuda_device_count(void);

// Device to host, then waits for the stream: the one host synchronisation
// of an op whose output size or error depends on device results.
int sok_gpu_copy_to_host(void* host, const void* device, size_t bytes, void* stream);
// Host to device from pageable host memory (not pinned), which CUDA copies
// before returning: `host` may be reused at once, with no wait for the stream.
int sok_gpu_copy_to_device(void* device, const void* host, size_t bytes, void* stream);
// Device to device, queued on the stream.
int sok_gpu_copy_on_device(void* dst, const void* src, size_t bytes, void* stream);
// bytes zero bytes at p, queued on the stream.
int sok_gpu_memset_zero(void* p, size_t bytes, void* stream);
// p[0, n) <- value, queued on the stream.
int sok_gpu_fill_i64(int64_t* p, int64_t value, int64_t n, void* stream);

// out[i] = in[i] on the device, int32 -> int64 and back (int32-keyed GPU
// tables store their keys widened; narrowing is exact for keys that came in
// as int32).
int sok_gpu_widen_i32(const int32_t* in, int64_t* out, int64_t n, void* stream);
int sok_gpu_narrow_i64(const int64_t* in, int32_t* out, int64_t n, void* stream);
// Between float32 and TensorFlow's 16-bit floats (half, bfloat16: their
// bit patterns as uint16_t; `bfloat` 0 for half, 1 for bfloat16), on the
// device: widening is exact, narrowing rounds to nearest even as Eigen's
// conversions do on the CPU. For ops whose kernels compute in float32.
int sok_gpu_16_to_f32(const uint16_t* in, float* out, int64_t n, int bfloat, void* stream);
int sok_gpu_f32_to_16(const float* in, uint16_t* out, int64_t n, int bfloat, void* stream);
// Makes CUDA device `device` current on the calling thread (cudaSetDevice):
// for libraries that take the device from the thread, such as NCCL's
// communicator set-up.
int sok_gpu_set_device(int device);
// *out <- bytes of pinned (page-locked) host memory, kept by the caller for
// the process (cudaHostAlloc): copies into it wait for the stream without
// holding the driver's lock as copies into pageable memory do.
int sok_gpu_host_alloc(void** out, size_t bytes);
// *out <- bytes of device memory of the current device, outside TensorFlow's
// allocator, kept by the caller for the process (cudaMalloc): for work on a
// stream of the caller's own, which must not touch memory TensorFlow's
// allocator hands out in the order of its compute stream.
int sok_gpu_device_alloc(void** out, size_t bytes);
// *out <- a new stream of the current device that does not wait for the
// legacy default stream (cudaStreamNonBlocking); kept by the caller.
int sok_gpu_stream_create(void** out);
// Work queued on `waiter` from now on starts after the work queued on
// `waited` so far (an event recorded on one, waited for on the other).
int sok_gpu_stream_after(void* waiter, void* waited);
// Waits until the work queued on the stream has finished.
int sok_gpu_stream_sync(void* stream);
// The name of a cudaError_t ("cudaErrorMemoryAllocation"), for error messages
// of kernels that do not include the CUDA headers.
const char* sok_gpu_error_name(int error);

// The CUDA runtime version the kernels were built with (1000 * major +
// 10 * minor, e.g. 12090), and the oldest NVIDIA driver that runtime
// supports (its major version: 525 for CUDA 12, 580 for CUDA 13).
int sok_cuda_runtime_version(void);
int sok_cuda_min_driver(void);

#ifdef __cplusplus
}
#endif

#endif  // SOK_GRAPH_TF_OPS_UTIL_KERNELS_GPU_MEMORY_LAUNCHER_H_
