// The hash set of a GPU unique, sized by the batch an op saw last, in one
// place for the GPU OpKernels that call the unique launchers (SokUnique,
// SokUniqueWithCounts, the dynamic table's unique find-or-insert).
//
// A graph's op sees batches alike (the same feature every step), so its set
// gets four slots per distinct value of its last batch
// (sok_unique_set_slots_after): a set that stays in the L2 cache and costs
// little to clear. A batch with many more distinct values overflows it; the
// op then runs the batch again with the full set before it returns: one
// more pass, paid only when a batch differs that much from the one before.
#ifndef SOK_GRAPH_TF_OPS_UTIL_KERNELS_UNIQUE_SET_HINT_H_
#define SOK_GRAPH_TF_OPS_UTIL_KERNELS_UNIQUE_SET_HINT_H_

#if defined(SOK_GRAPH_WITH_CUDA) && SOK_GRAPH_WITH_CUDA

#include <atomic>
#include <cstdint>

#include "tensorflow/core/framework/op_kernel.h"
#include "compat/tf_compat.h"
#include "tf_ops/util/kernels/util_launcher.h"

namespace sok_graph {

class UniqueSetHint {
 public:
  // run(set_slots, &distinct) runs the unique of an n-key batch in a set of
  // set_slots slots (0: the full set) and whatever the caller does with it,
  // and leaves the number of distinct keys in `distinct`, negative when the
  // set overflowed. Run in the hinted set, then, on overflow, in the full
  // one; the count is remembered for the next batch.
  template <typename RunFn>
  ::tensorflow::Status Run(int64_t n, RunFn run, int64_t* distinct) {
    const int64_t hinted = sok_unique_set_slots_after(last_.load(), n);
    TF_RETURN_IF_ERROR(run(hinted, distinct));
    if (*distinct < 0 && hinted != 0) TF_RETURN_IF_ERROR(run(0, distinct));
    if (*distinct < 0) {
      return ::tensorflow::errors::Internal("unique's full hash set overflowed");
    }
    last_.store(*distinct);
    return OkStatus();
  }

 private:
  std::atomic<int64_t> last_{-1};
};

}  // namespace sok_graph

#endif  // SOK_GRAPH_WITH_CUDA

#endif  // SOK_GRAPH_TF_OPS_UTIL_KERNELS_UNIQUE_SET_HINT_H_
