// The CUDA stream of the op being run, for passing to C launchers. Only GPU
// OpKernels include this; their .cc files are compiled when the build found a
// CUDA toolkit.
#ifndef SOK_GRAPH_TF_OPS_COMMON_GPU_STREAM_H_
#define SOK_GRAPH_TF_OPS_COMMON_GPU_STREAM_H_

#include "tensorflow/core/framework/device_base.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "compat/gpu_stream_handle.h"

namespace sok_graph {

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
