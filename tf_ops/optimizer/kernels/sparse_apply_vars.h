// The variables of SokSparseApply: each table and slot variable looked up,
// locked exclusively (in increasing mutex address, TensorFlow's order for
// multi-variable kernels, so no deadlock), checked, and made safe to update
// in place. Shared by the CPU and GPU kernels.
//
// In place: like TensorFlow's sparse scatter and apply kernels, the first
// sparse write puts a variable in copy-on-read mode (its later dense reads
// copy), and a buffer that a dense read still shares is copied before it is
// written, so no reader sees rows change under it.
#ifndef SOK_GRAPH_TF_OPS_OPTIMIZER_KERNELS_SPARSE_APPLY_VARS_H_
#define SOK_GRAPH_TF_OPS_OPTIMIZER_KERNELS_SPARSE_APPLY_VARS_H_

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/lib/strings/strcat.h"
#include "compat/tf_compat.h"
#include "tf_ops/optimizer/core/sparse_apply.h"
#include "tf_ops/optimizer/kernels/sparse_apply_spec.h"

namespace sok_graph {

class SparseApplyAttrs {
 public:
  ::tensorflow::Status Parse(::tensorflow::OpKernelConstruction* ctx) {
    std::string algorithm;
    TF_RETURN_IF_ERROR(ctx->GetAttr("num_tables", &num_tables));
    TF_RETURN_IF_ERROR(ctx->GetAttr("num_slot_vars", &num_slot_vars));
    TF_RETURN_IF_ERROR(ctx->GetAttr("algorithm", &algorithm));
    TF_RETURN_IF_ERROR(ParseSparseFormulas(ctx, &config.formulas));
    TF_RETURN_IF_ERROR(ctx->GetAttr("nesterov", &nesterov));
    TF_RETURN_IF_ERROR(CheckSparseApplySpec(ctx));
    core::SparseAlgorithm a;
    if (!core::ParseSparseAlgorithm(algorithm.c_str(), &a)) {
      return ::tensorflow::errors::InvalidArgument("algorithm '", algorithm, "' is not fused");
    }
    slots_per_table = core::SlotCount(a);
    if (num_slot_vars != num_tables * slots_per_table) {
      return ::tensorflow::errors::InvalidArgument(
          "algorithm '", algorithm, "' keeps ", slots_per_table, " slot(s) per table: slots must "
          "have ", num_tables * slots_per_table, " entries for num_tables=", num_tables,
          "; got num_slot_vars=", num_slot_vars);
    }
    config.algorithm = static_cast<int32_t>(a);
    config.nesterov = nesterov ? 1 : 0;
    return OkStatus();
  }

  int num_tables = 0;
  int num_slot_vars = 0;
  int slots_per_table = 0;
  bool nesterov = false;
  core::SparseApplyConfig config{};
};

class SparseApplyVariables {
 public:
  // copy(dst, src, bytes) copies a variable's buffer on its device.
  using Copy = std::function<::tensorflow::Status(void*, const void*, size_t)>;
  // Called once per variable with its buffer, when the variable is first
  // made writable in place (its first sparse update by this op).
  using FirstUpdate = std::function<void(void*, size_t)>;

  SparseApplyVariables() = default;
  SparseApplyVariables(const SparseApplyVariables&) = delete;
  SparseApplyVariables& operator=(const SparseApplyVariables&) = delete;
  ~SparseApplyVariables() {
    for (::tensorflow::mutex* mu : locked_) mu->unlock();
    for (::tensorflow::Var* var : vars_) var->Unref();
  }

  // Inputs [0, num_tables) are the tables, then num_slot_vars slots. Each
  // slot must have its table's shape; every variable float32 [rows, dim].
  ::tensorflow::Status Acquire(::tensorflow::OpKernelContext* ctx, const SparseApplyAttrs& a,
                               const Copy& copy, const FirstUpdate& first_update = nullptr) {
    namespace errors = ::tensorflow::errors;
    const int total = a.num_tables + a.num_slot_vars;
    for (int i = 0; i < total; ++i) {
      ::tensorflow::Var* var = nullptr;
      const ::tensorflow::Status s =
          ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, i), &var);
      if (!s.ok()) {
        return errors::FailedPrecondition(Name(a, i), " cannot be updated (is it "
                                          "initialized?): ", s.ToString());
      }
      vars_.push_back(var);
    }
    for (::tensorflow::Var* var : vars_) locked_.push_back(var->mu());
    std::sort(locked_.begin(), locked_.end());
    locked_.erase(std::unique(locked_.begin(), locked_.end()), locked_.end());
    for (::tensorflow::mutex* mu : locked_) mu->lock();
    for (int i = 0; i < total; ++i) {
      ::tensorflow::Var* var = vars_[i];
      if (!var->is_initialized) return errors::FailedPrecondition(Name(a, i), " is not initialized");
      const ::tensorflow::Tensor& t = *var->tensor();
      if (t.dtype() != ::tensorflow::DT_FLOAT || t.dims() != 2) {
        return errors::InvalidArgument(Name(a, i), " must be a float32 [rows, dim] variable; got ",
                                       ::tensorflow::DataTypeString(t.dtype()), " ",
                                       t.shape().DebugString());
      }
      if (i >= a.num_tables) {
        const ::tensorflow::Tensor& table = *vars_[TableOf(a, i)]->tensor();
        if (t.shape() != table.shape()) {
          return errors::InvalidArgument(Name(a, i), " has shape ", t.shape().DebugString(),
                                         "; its table has ", table.shape().DebugString());
        }
      }
    }
    // Writable in place (see the header comment). A variable listed twice
    // was made so the first time.
    for (::tensorflow::Var* var : vars_) {
      if (var->copy_on_read_mode.load()) continue;
      ::tensorflow::Tensor* t = var->tensor();
#if SOK_GRAPH_TF_MAJOR < 2
      // TF 1.x keeps a tensor's reference count private: copy once, as if
      // shared (only the first sparse update of a variable pays for it).
      const bool shared = true;
#else
      const bool shared = !t->RefCountIsOne();
#endif
      if (shared) {
        ::tensorflow::Tensor fresh;
        ::tensorflow::AllocatorAttributes attr;
        attr.set_gpu_compatible(true);
        attr.set_nic_compatible(true);
        TF_RETURN_IF_ERROR(ctx->allocate_temp(t->dtype(), t->shape(), &fresh, attr));
        TF_RETURN_IF_ERROR(copy(const_cast<char*>(fresh.tensor_data().data()),
                                t->tensor_data().data(), t->TotalBytes()));
        *t = fresh;
      }
      if (first_update) first_update(const_cast<char*>(t->tensor_data().data()), t->TotalBytes());
      var->copy_on_read_mode.store(true);
    }
    return OkStatus();
  }

  ::tensorflow::Tensor* table(int t) { return vars_[t]->tensor(); }
  // Slot k of table t, or null where the algorithm keeps fewer.
  float* slot(const SparseApplyAttrs& a, int t, int k) {
    if (k >= a.slots_per_table) return nullptr;
    return vars_[a.num_tables + t * a.slots_per_table + k]->tensor()->flat<float>().data();
  }

  static int TableOf(const SparseApplyAttrs& a, int input) {
    return input < a.num_tables ? input : (input - a.num_tables) / a.slots_per_table;
  }
  static std::string Name(const SparseApplyAttrs& a, int input) {
    if (input < a.num_tables) return ::tensorflow::strings::StrCat("vars[", input, "]");
    return ::tensorflow::strings::StrCat("slots[", input - a.num_tables, "] (of vars[",
                                         TableOf(a, input), "])");
  }

 private:
  std::vector<::tensorflow::Var*> vars_;
  std::vector<::tensorflow::mutex*> locked_;
};

// Checks indices[t] and grads[t] against table t ([rows, dim]): a vector of
// `count` indices, grads [count, dim].
inline ::tensorflow::Status CheckSparseGradient(int t, const ::tensorflow::Tensor& table,
                                                const ::tensorflow::Tensor& indices,
                                                const ::tensorflow::Tensor& grads) {
  namespace errors = ::tensorflow::errors;
  if (indices.dims() != 1) {
    return errors::InvalidArgument("indices[", t, "] must be a vector; got shape ",
                                   indices.shape().DebugString());
  }
  if (grads.dims() != 2 || grads.dim_size(0) != indices.dim_size(0) ||
      grads.dim_size(1) != table.dim_size(1)) {
    return errors::InvalidArgument("grads[", t, "] must be [len(indices[", t, "]), ",
                                   table.dim_size(1), "] = [", indices.dim_size(0), ", ",
                                   table.dim_size(1), "]; got ", grads.shape().DebugString());
  }
  return OkStatus();
}

}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_OPTIMIZER_KERNELS_SPARSE_APPLY_VARS_H_
