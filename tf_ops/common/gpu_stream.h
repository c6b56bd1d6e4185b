// The CUDA stream of the op being run, for passing to C launchers. Only GPU
// OpKernels include this; their .cc files are compiled when the build found a
// CUDA toolkit.
#ifndef SOK_GRAPH_TF_OPS_COMMON_GPU_STREAM_H_
#define SOK_GRAPH_TF_OPS_COMMON_GPU_STREAM_H_

#include "tensorflow/core/framework/device_base.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tf_ops/common/tf_compat.h"

// The stream executor moved from tensorflow/ (1.x) to tensorflow/compiler/xla
// (2.x) to xla/ (2.15 onwards).
#if __has_include("xla/stream_executor/stream.h")
#include "xla/stream_executor/stream.h"
#elif __has_include("tensorflow/compiler/xla/stream_executor/stream.h")
#include "tensorflow/compiler/xla/stream_executor/stream.h"
#if __has_include("tensorflow/compiler/xla/stream_executor/stream_executor_internal.h")
#include "tensorflow/compiler/xla/stream_executor/stream_executor_internal.h"
#endif
#else
#include "tensorflow/stream_executor/stream.h"
#include "tensorflow/stream_executor/stream_executor_internal.h"
#endif

namespace sok_graph {
namespace gpu_stream_internal {

// The CUstream of a stream executor Stream. Newer TensorFlow (2.14 on)
// hands it out as platform_specific_handle().stream; older ones (1.x up to
// 2.13) only through their GPU stream implementation's GpuStreamHack().
// Chosen by what the Stream type has (the int overload wins when viable),
// so no version number has to say where the change happened.
template <class S>
auto Handle(S* stream, int) -> decltype(static_cast<void*>(stream->platform_specific_handle().stream)) {
  return stream->platform_specific_handle().stream;
}
template <class S>
void* Handle(S* stream, long) {  // NOLINT(runtime/int): the overload's rank
  return stream->implementation()->GpuStreamHack();
}

}  // namespace gpu_stream_internal

// A cudaStream_t as void*, or nullptr (the default stream) when the op has no
// device context.
inline void* GpuStreamOf(::tensorflow::OpKernelContext* ctx) {
  ::tensorflow::DeviceContext* dc = ctx->op_device_context();
  if (dc == nullptr || dc->stream() == nullptr) return nullptr;
  return gpu_stream_internal::Handle(dc->stream(), 0);
}

// A GPU OpKernel that waits for its stream in Compute (to size an output
// or to see an error the device found). TensorFlow takes GPU kernels to be
// cheap — they only enqueue work — and runs them inline on the executor
// thread that made them ready, ahead of the other ready ops of that thread.
// One that waits would then hold those ops back for the wait: the copy of
// the lookup's check to the host, the next kernels to enqueue, the dense
// layers. Marked expensive, it runs on a thread of its own and the
// executor goes on meanwhile. `waits` says, per kernel instance, whether it
// can wait at all.
template <class Base = ::tensorflow::OpKernel>
class DeviceWaitingKernel : public Base {
 public:
  explicit DeviceWaitingKernel(::tensorflow::OpKernelConstruction* ctx, bool waits = true)
      : Base(ctx), waits_(waits) {}
  bool IsExpensive() override { return waits_; }

 protected:
  void set_waits(bool waits) { waits_ = waits; }

 private:
  bool waits_;
};

}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_COMMON_GPU_STREAM_H_
