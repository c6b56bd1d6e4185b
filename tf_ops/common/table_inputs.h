// The `params` inputs of the ops that read tables (the fused lookup, the
// exchange's grouped gather): each table is either a tensor or a
// resource variable. A variable is read in place, under a shared lock held
// for as long as the TableInputs object lives, instead of through a
// ReadVariableOp: once a sparse update (an optimizer's scatter) has touched
// a variable, TensorFlow copies the whole table on every dense read
// (copy-on-read), which for large tables costs more than the lookup itself.
// The locking matches TensorFlow's own ResourceGather: a shared lock, so
// assignments and dense updates (exclusive lock) wait for the read, while
// TensorFlow's scatters of float rows, which also run under the shared lock,
// may be seen half-applied by a lookup running at the same time, as by a
// gather. Locks are taken in increasing mutex address, the order
// TensorFlow's multi-variable kernels use, so no deadlock.
#ifndef SOK_GRAPH_TF_OPS_COMMON_TABLE_INPUTS_H_
#define SOK_GRAPH_TF_OPS_COMMON_TABLE_INPUTS_H_

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/lib/core/errors.h"
#include "compat/tf_compat.h"

namespace sok_graph {

class TableInputs {
 public:
  TableInputs() = default;
  TableInputs(const TableInputs&) = delete;
  TableInputs& operator=(const TableInputs&) = delete;
  ~TableInputs() { Release(); }

  // Reads the input list `name`, which must have `count` entries.
  // table_name(t) names table t in errors.
  ::tensorflow::Status Read(::tensorflow::OpKernelContext* ctx, const char* name, int count,
                            const std::function<std::string(int)>& table_name) {
    namespace errors = ::tensorflow::errors;
    Release();
    int start = 0, stop = 0;
    TF_RETURN_IF_ERROR(ctx->op_kernel().InputRange(name, &start, &stop));
    if (stop - start != count) {
      return errors::InvalidArgument(name, " must have ", count, " entries (num_tables); got ",
                                     stop - start);
    }
    tensors_.assign(static_cast<size_t>(stop - start), nullptr);
    std::vector<::tensorflow::Var*> vars(tensors_.size(), nullptr);
    for (int i = start; i < stop; ++i) {
      const int t = i - start;
      if (ctx->input_dtype(i) != ::tensorflow::DT_RESOURCE) {
        tensors_[t] = &ctx->input(i);
        continue;
      }
      ::tensorflow::Var* var = nullptr;
      const ::tensorflow::Status s =
          ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, i), &var);
      if (!s.ok()) {
        return errors::FailedPrecondition("the variable of ", table_name(t),
                                          " cannot be read (is it initialized?): ",
                                          s.ToString());
      }
      vars_.push_back(var);  // Unref'd by Release()
      vars[t] = var;
    }
    for (::tensorflow::Var* var : vars_) locked_.push_back(var->mu());
    std::sort(locked_.begin(), locked_.end());
    locked_.erase(std::unique(locked_.begin(), locked_.end()), locked_.end());
    for (::tensorflow::mutex* mu : locked_) mu->lock_shared();
    for (size_t t = 0; t < vars.size(); ++t) {
      if (vars[t] == nullptr) continue;
      if (!vars[t]->is_initialized) {
        return errors::FailedPrecondition("the variable of ", table_name(static_cast<int>(t)),
                                          " is not initialized");
      }
      tensors_[t] = vars[t]->tensor();
    }
    return OkStatus();
  }

  const ::tensorflow::Tensor& operator[](int t) const { return *tensors_[t]; }
  int size() const { return static_cast<int>(tensors_.size()); }

 private:
  void Release() {
    for (::tensorflow::mutex* mu : locked_) mu->unlock_shared();
    locked_.clear();
    for (::tensorflow::Var* var : vars_) var->Unref();
    vars_.clear();
    tensors_.clear();
  }

  std::vector<const ::tensorflow::Tensor*> tensors_;
  std::vector<::tensorflow::Var*> vars_;
  std::vector<::tensorflow::mutex*> locked_;
};

}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_COMMON_TABLE_INPUTS_H_
