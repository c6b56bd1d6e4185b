// Device-memory helpers for the GPU OpKernels (see gpu_memory_launcher.h).
#include <algorithm>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "tf_ops/util/kernels/gpu_memory_launcher.h"

namespace {

__global__ void FillI64(int64_t* p, int64_t value, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    p[i] = value;
  }
}

// What static_cast does, except between float and the 16-bit floats,
// where the rounding is spelled out: to nearest even.
template <typename From, typename To>
struct Cast {
  __device__ To operator()(From x) const { return static_cast<To>(x); }
};
template <>
struct Cast<__half, float> {
  __device__ float operator()(__half x) const { return __half2float(x); }
};
template <>
struct Cast<float, __half> {
  __device__ __half operator()(float x) const { return __float2half_rn(x); }
};
template <>
struct Cast<__nv_bfloat16, float> {
  __device__ float operator()(__nv_bfloat16 x) const { return __bfloat162float(x); }
};
template <>
struct Cast<float, __nv_bfloat16> {
  __device__ __nv_bfloat16 operator()(float x) const { return __float2bfloat16_rn(x); }
};

template <typename From, typename To>
__global__ void Convert(const From* in, To* out, int64_t n) {
  const Cast<From, To> cast;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = cast(in[i]);
  }
}

template <typename From, typename To>
int LaunchConvert(const From* in, To* out, int64_t n, void* stream) {
  if (n <= 0) return 0;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 4096));
  Convert<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(in, out, n);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

#define SOK_EXPORT extern "C" __attribute__((visibility("default")))

SOK_EXPORT int sok_gpu_copy_to_host(void* host, const void* device, size_t bytes, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (bytes == 0) return 0;
  cudaError_t err = cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, s);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  return static_cast<int>(err);
}

SOK_EXPORT int sok_gpu_copy_to_device(void* device, const void* host, size_t bytes,
                                      void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (bytes == 0) return 0;
  // From pageable memory (callers pass std::vector data), CUDA stages the
  // bytes before returning, so the host buffer is free again without
  // waiting for the stream.
  return static_cast<int>(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, s));
}

SOK_EXPORT int sok_gpu_copy_on_device(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return 0;
  return static_cast<int>(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                          static_cast<cudaStream_t>(stream)));
}

SOK_EXPORT int sok_gpu_memset_zero(void* p, size_t bytes, void* stream) {
  if (bytes == 0) return 0;
  return static_cast<int>(cudaMemsetAsync(p, 0, bytes, static_cast<cudaStream_t>(stream)));
}

SOK_EXPORT int sok_gpu_host_alloc(void** out, size_t bytes) {
  return static_cast<int>(cudaHostAlloc(out, bytes, cudaHostAllocPortable));
}

SOK_EXPORT int sok_gpu_device_alloc(void** out, size_t bytes) {
  return static_cast<int>(cudaMalloc(out, bytes));
}

SOK_EXPORT int sok_cuda_device_count(void) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) return 0;
  if (err != cudaSuccess) return -static_cast<int>(err);
  return count;
}

SOK_EXPORT int sok_gpu_set_device(int device) {
  return static_cast<int>(cudaSetDevice(device));
}

SOK_EXPORT int sok_gpu_stream_create(void** out) {
  cudaStream_t s = nullptr;
  const cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  *out = s;
  return static_cast<int>(err);
}

SOK_EXPORT int sok_gpu_stream_after(void* waiter, void* waited) {
  cudaEvent_t event = nullptr;
  cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (err != cudaSuccess) return static_cast<int>(err);
  err = cudaEventRecord(event, static_cast<cudaStream_t>(waited));
  if (err == cudaSuccess) err = cudaStreamWaitEvent(static_cast<cudaStream_t>(waiter), event, 0);
  // The event's resources are released once it completes.
  const cudaError_t destroyed = cudaEventDestroy(event);
  return static_cast<int>(err != cudaSuccess ? err : destroyed);
}

SOK_EXPORT int sok_gpu_stream_sync(void* stream) {
  return static_cast<int>(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

SOK_EXPORT int sok_gpu_fill_i64(int64_t* p, int64_t value, int64_t n, void* stream) {
  if (n <= 0) return 0;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 1024));
  FillI64<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(p, value, n);
  return static_cast<int>(cudaGetLastError());
}

SOK_EXPORT int sok_gpu_widen_i32(const int32_t* in, int64_t* out, int64_t n, void* stream) {
  return LaunchConvert(in, out, n, stream);
}

SOK_EXPORT int sok_gpu_narrow_i64(const int64_t* in, int32_t* out, int64_t n, void* stream) {
  return LaunchConvert(in, out, n, stream);
}

SOK_EXPORT int sok_gpu_16_to_f32(const uint16_t* in, float* out, int64_t n, int bfloat,
                                 void* stream) {
  if (bfloat) return LaunchConvert(reinterpret_cast<const __nv_bfloat16*>(in), out, n, stream);
  return LaunchConvert(reinterpret_cast<const __half*>(in), out, n, stream);
}

SOK_EXPORT int sok_gpu_f32_to_16(const float* in, uint16_t* out, int64_t n, int bfloat,
                                 void* stream) {
  if (bfloat) return LaunchConvert(in, reinterpret_cast<__nv_bfloat16*>(out), n, stream);
  return LaunchConvert(in, reinterpret_cast<__half*>(out), n, stream);
}

SOK_EXPORT const char* sok_gpu_error_name(int error) {
  return cudaGetErrorName(static_cast<cudaError_t>(error));
}

SOK_EXPORT int sok_cuda_runtime_version(void) { return CUDART_VERSION; }

SOK_EXPORT int sok_cuda_min_driver(void) {
  // NVIDIA's minimum drivers per CUDA major version (Linux), for the
  // minor-version compatibility the static runtime relies on.
  switch (CUDART_VERSION / 1000) {
    case 11:
      return 450;
    case 12:
      return 525;
    case 13:
      return 580;
    default:
      return 0;
  }
}
