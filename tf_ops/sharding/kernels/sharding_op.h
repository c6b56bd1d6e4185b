// The one OpKernel of each sharding op (SokBucketizeByOwner, SokLocalRows,
// SokRouteGroupedKeys, SokGroupedGather and its gradient) for every device:
// attributes and input shapes checked once here, the work in the device's
// functor — the CPU's in sharding_kernels.cc (tf_ops/sharding/core), the
// GPU's in sharding_kernels_gpu.cc (the launchers of bucketize.cu,
// local_rows.cu, route_keys.cu and grouped_gather.cu). Each device file registers the kernels with its
// functor.
#ifndef SOK_GRAPH_TF_OPS_SHARDING_KERNELS_SHARDING_OP_H_
#define SOK_GRAPH_TF_OPS_SHARDING_KERNELS_SHARDING_OP_H_

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "compat/tf_compat.h"
#include "tf_ops/common/gpu_stream.h"
#include "tf_ops/common/table_inputs.h"
#include "tf_ops/sharding/kernels/sharding_args.h"

namespace sok_graph {
namespace sharding_kernels {

struct CpuDevice {};
struct GpuDevice {};

// SokBucketizeByOwner's outputs, allocated by the op.
struct Buckets {
  ::tensorflow::Tensor* bucketed = nullptr;  // ids in owner order
  int64_t* sizes = nullptr;                  // [world_size]
  int64_t* perm = nullptr;                   // bucketed[i] = ids[perm[i]]
  int64_t* inverse = nullptr;                // ids[i] = bucketed[inverse[i]]
};

// The devices' work:
//   BucketizeFunctor: Status operator()(ctx, ids, world_size, fixed_owner,
//     check_negative, buckets); a negative id is an error (NegativeIdError)
//     unless the caller vouches for the ids (check_negative false: the GPU
//     then skips its read-back; the CPU checks anyway, at no cost).
//   LocalRowsFunctor: Status operator()(ctx, ids, world_size, out).
template <typename Device, typename K>
struct BucketizeFunctor;
template <typename Device, typename K>
struct LocalRowsFunctor;

constexpr int kMaxWorldSize = 1 << 20;

// world_size and fixed_owner of an op that places ids on workers, checked.
inline ::tensorflow::Status ReadOwnerAttrs(::tensorflow::OpKernelConstruction* ctx,
                                           int* world_size, int* fixed_owner) {
  namespace errors = ::tensorflow::errors;
  TF_RETURN_IF_ERROR(ctx->GetAttr("world_size", world_size));
  TF_RETURN_IF_ERROR(ctx->GetAttr("fixed_owner", fixed_owner));
  if (*fixed_owner >= *world_size) {
    return errors::InvalidArgument("fixed_owner must be < world_size (", *world_size,
                                   "); got ", *fixed_owner);
  }
  // Outputs and scratch hold world_size entries each: an absurd world_size
  // would allocate gigabytes.
  if (*world_size > kMaxWorldSize) {
    return errors::InvalidArgument("world_size must be <= ", kMaxWorldSize, "; got ",
                                   *world_size);
  }
  return OkStatus();
}

template <typename Device, typename K>
class BucketizeByOwnerOp : public DeviceWaitingKernel<> {
 public:
  explicit BucketizeByOwnerOp(::tensorflow::OpKernelConstruction* ctx)
      : DeviceWaitingKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadOwnerAttrs(ctx, &world_size_, &fixed_owner_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("check_negative", &check_negative_));
  }

  void Compute(::tensorflow::OpKernelContext* ctx) override {
    const ::tensorflow::Tensor& ids = ctx->input(0);
    OP_REQUIRES(ctx, ids.dims() == 1,
                ::tensorflow::errors::InvalidArgument("ids must be a vector; got shape ",
                                                      ids.shape().DebugString()));
    Buckets out;
    ::tensorflow::Tensor *sizes = nullptr, *perm = nullptr, *inverse = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ids.shape(), &out.bucketed));
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(1, ::tensorflow::TensorShape({world_size_}), &sizes));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, ids.shape(), &perm));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, ids.shape(), &inverse));
    out.sizes = AsInt64(sizes);
    out.perm = AsInt64(perm);
    out.inverse = AsInt64(inverse);
    OP_REQUIRES_OK(ctx, (BucketizeFunctor<Device, K>()(ctx, ids, world_size_, fixed_owner_,
                                                       check_negative_, out)));
  }

 private:
  static int64_t* AsInt64(::tensorflow::Tensor* t) {
    return reinterpret_cast<int64_t*>(t->flat<TfInt64>().data());
  }
  int world_size_ = 1;
  int fixed_owner_ = -1;
  bool check_negative_ = true;
};

template <typename Device, typename K>
class LocalRowsOp : public DeviceWaitingKernel<> {
 public:
  explicit LocalRowsOp(::tensorflow::OpKernelConstruction* ctx) : DeviceWaitingKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("world_size", &world_size_));
  }

  void Compute(::tensorflow::OpKernelContext* ctx) override {
    const ::tensorflow::Tensor& ids = ctx->input(0);
    ::tensorflow::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ids.shape(), &out));
    OP_REQUIRES_OK(ctx, (LocalRowsFunctor<Device, K>()(ctx, ids, world_size_, out)));
  }

 private:
  int world_size_ = 1;
};


// SokRouteGroupedKeys's inputs and outputs, checked and allocated by the op.
struct RouteArgs {
  const int64_t* ids = nullptr;     // [n]
  const int64_t* tables = nullptr;  // [n]
  int64_t n = 0;
  int64_t num_tables = 1;
  int64_t world_size = 1;
  int64_t fixed_owner = -1;
  int64_t* sent = nullptr;   // [n]
  int64_t* sizes = nullptr;  // [world_size]
  int64_t* slots = nullptr;  // [n]
};

// RouteFunctor: Status operator()(ctx, args) (core::RouteGroupedKeys on the
// CPU, route_keys.cu on the GPU).
template <typename Device>
struct RouteFunctor;

template <typename Device>
class RouteGroupedKeysOp : public ::tensorflow::OpKernel {
 public:
  explicit RouteGroupedKeysOp(::tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    int num_tables = 0, world_size = 0, fixed_owner = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_tables", &num_tables));
    OP_REQUIRES_OK(ctx, ReadOwnerAttrs(ctx, &world_size, &fixed_owner));
    num_tables_ = num_tables;
    world_size_ = world_size;
    fixed_owner_ = fixed_owner;
  }

  void Compute(::tensorflow::OpKernelContext* ctx) override {
    namespace errors = ::tensorflow::errors;
    const ::tensorflow::Tensor& ids = ctx->input(0);
    const ::tensorflow::Tensor& tables = ctx->input(1);
    OP_REQUIRES(ctx, ids.dims() == 1 && tables.dims() == 1 &&
                         ids.NumElements() == tables.NumElements(),
                errors::InvalidArgument("ids and tables must be vectors of one length; got "
                                        "shapes ", ids.shape().DebugString(), " and ",
                                        tables.shape().DebugString()));
    ::tensorflow::Tensor *sent = nullptr, *sizes = nullptr, *slots = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ids.shape(), &sent));
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(1, ::tensorflow::TensorShape({world_size_}), &sizes));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, ids.shape(), &slots));
    RouteArgs args;
    args.ids = reinterpret_cast<const int64_t*>(ids.flat<TfInt64>().data());
    args.tables = reinterpret_cast<const int64_t*>(tables.flat<TfInt64>().data());
    args.n = ids.NumElements();
    args.num_tables = num_tables_;
    args.world_size = world_size_;
    args.fixed_owner = fixed_owner_;
    args.sent = reinterpret_cast<int64_t*>(sent->flat<TfInt64>().data());
    args.sizes = reinterpret_cast<int64_t*>(sizes->flat<TfInt64>().data());
    args.slots = reinterpret_cast<int64_t*>(slots->flat<TfInt64>().data());
    OP_REQUIRES_OK(ctx, RouteFunctor<Device>()(ctx, args));
  }

 private:
  int64_t num_tables_ = 1;
  int64_t world_size_ = 1;
  int64_t fixed_owner_ = -1;
};

// SokGroupedGather's tables, checked: each table's first row and row count,
// and the bytes of a row (all tables have one dtype and dimension).
struct GroupedTables {
  std::vector<const char*> rows;
  std::vector<int64_t> counts;
  std::vector<std::string> names;  // for errors
  int64_t dim = 0;
  int64_t row_bytes = 0;
  bool padded_keys = false;  // a bad key reads a zero row on every device
};

// SokGroupedGatherGrad's outputs, allocated by the op: table t's keys are
// positions [offsets[t], offsets[t + 1]) of the permutation.
struct GroupedGrads {
  std::vector<int64_t> offsets;         // [num_tables + 1]
  std::vector<int64_t*> indices;        // [num_tables]
  std::vector<char*> values;            // [num_tables]
  int64_t row_bytes = 0;
};

// GroupedGatherFunctor: Status operator()(ctx, tables, keys, out): out[i]
//   the row of keys[i] (CPU: a bad key is an error naming its table; GPU: a
//   zero row, see the op's doc).
// GroupedGatherGradFunctor: Status operator()(ctx, keys, grads, permutation,
//   outputs).
template <typename Device>
struct GroupedGatherFunctor;
template <typename Device>
struct GroupedGatherGradFunctor;

inline std::string GroupedTableName(const std::vector<std::string>& names, int t) {
  if (t < static_cast<int>(names.size())) return "table '" + names[t] + "'";
  return "table " + std::to_string(t);
}

// The per-table counts of the grouped ops (host memory), checked to be
// num_tables counts >= 0 that add up to n (at most n with padded keys, the
// padding after them); their running sums in `offsets`.
inline ::tensorflow::Status GroupOffsets(const ::tensorflow::Tensor& sizes, int num_tables,
                                         int64_t n, bool padded, std::vector<int64_t>* offsets) {
  namespace errors = ::tensorflow::errors;
  if (sizes.dims() != 1 || sizes.NumElements() != num_tables) {
    return errors::InvalidArgument("table_sizes must be a vector of num_tables=", num_tables,
                                   " counts; got shape ", sizes.shape().DebugString());
  }
  const auto counts = sizes.flat<TfInt64>();
  offsets->assign(1, 0);
  for (int t = 0; t < num_tables; ++t) {
    if (counts(t) < 0 || counts(t) > n - offsets->back()) {
      return errors::InvalidArgument("table_sizes must be counts >= 0 that add up to the ",
                                     n, " keys; got ", static_cast<int64_t>(counts(t)),
                                     " at table ", t, " after ", offsets->back());
    }
    offsets->push_back(offsets->back() + counts(t));
  }
  if (offsets->back() != n && !padded) {
    return errors::InvalidArgument("table_sizes must add up to the ", n, " keys; they add up to ",
                                   offsets->back());
  }
  return OkStatus();
}

template <typename Device, typename T>
class GroupedGatherOp : public ::tensorflow::OpKernel {
 public:
  explicit GroupedGatherOp(::tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_tables", &num_tables_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_names", &names_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("padded_keys", &padded_));
    OP_REQUIRES(ctx, names_.empty() || static_cast<int>(names_.size()) == num_tables_,
                ::tensorflow::errors::InvalidArgument(
                    "table_names must be empty or have num_tables=", num_tables_,
                    " entries; got ", names_.size()));
  }

  void Compute(::tensorflow::OpKernelContext* ctx) override {
    namespace errors = ::tensorflow::errors;
    TableInputs params;
    OP_REQUIRES_OK(ctx, params.Read(ctx, "params", num_tables_,
                                    [this](int t) { return GroupedTableName(names_, t); }));
    const ::tensorflow::Tensor& keys = ctx->input(num_tables_);
    OP_REQUIRES(ctx, keys.dims() == 1,
                errors::InvalidArgument("keys must be a vector; got shape ",
                                        keys.shape().DebugString()));
    // table_sizes are for the gradient. A GPU kernel takes them in device
    // memory and does not read them: reading them would make it wait for
    // the device (the unique that counts them does not).
    if (std::is_same<Device, CpuDevice>::value) {
      std::vector<int64_t> offsets;
      OP_REQUIRES_OK(ctx, GroupOffsets(ctx->input(num_tables_ + 1), num_tables_,
                                       keys.NumElements(), padded_, &offsets));
    }
    GroupedTables tables;
    tables.names = names_;
    tables.padded_keys = padded_;
    const auto dtype = ::tensorflow::DataTypeToEnum<T>::v();
    for (int t = 0; t < num_tables_; ++t) {
      const ::tensorflow::Tensor& p = params[t];
      OP_REQUIRES(ctx, p.dtype() == dtype && p.dims() == 2,
                  errors::InvalidArgument(
                      "params of ", GroupedTableName(names_, t), " must be a [rows, dim] ",
                      ::tensorflow::DataTypeString(dtype), " table; got ",
                      ::tensorflow::DataTypeString(p.dtype()), " of shape ",
                      p.shape().DebugString()));
      if (t == 0) tables.dim = p.dim_size(1);
      OP_REQUIRES(ctx, p.dim_size(1) == tables.dim,
                  errors::InvalidArgument("every table of a grouped gather must have one "
                                          "dimension: ", GroupedTableName(names_, 0), " has ",
                                          tables.dim, ", ", GroupedTableName(names_, t),
                                          " has ", p.dim_size(1)));
      tables.rows.push_back(p.tensor_data().data());
      tables.counts.push_back(p.dim_size(0));
    }
    tables.row_bytes = tables.dim * static_cast<int64_t>(sizeof(T));
    ::tensorflow::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, ::tensorflow::TensorShape({keys.NumElements(), tables.dim}), &out));
    OP_REQUIRES_OK(ctx, GroupedGatherFunctor<Device>()(ctx, tables, keys, out));
  }

 private:
  int num_tables_ = 1;
  std::vector<std::string> names_;
  bool padded_ = false;
};

template <typename Device, typename T>
class GroupedGatherGradOp : public ::tensorflow::OpKernel {
 public:
  explicit GroupedGatherGradOp(::tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_tables", &num_tables_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("padded_keys", &padded_));
  }

  void Compute(::tensorflow::OpKernelContext* ctx) override {
    namespace errors = ::tensorflow::errors;
    const ::tensorflow::Tensor& keys = ctx->input(0);
    const ::tensorflow::Tensor& grads = ctx->input(1);
    const ::tensorflow::Tensor& permutation = ctx->input(2);
    const int64_t n = keys.NumElements();
    OP_REQUIRES(ctx, keys.dims() == 1 && permutation.dims() == 1 &&
                         permutation.NumElements() == n,
                errors::InvalidArgument("keys and permutation must be vectors of one length; "
                                        "got shapes ", keys.shape().DebugString(), " and ",
                                        permutation.shape().DebugString()));
    OP_REQUIRES(ctx, grads.dims() == 2 && grads.dim_size(0) == n,
                errors::InvalidArgument("grads must be [", n, ", dim] (a row per key); got ",
                                        grads.shape().DebugString()));
    GroupedGrads out;
    OP_REQUIRES_OK(ctx, GroupOffsets(ctx->input(3), num_tables_, n, padded_, &out.offsets));
    const int64_t dim = grads.dim_size(1);
    out.row_bytes = dim * static_cast<int64_t>(sizeof(T));
    for (int t = 0; t < num_tables_; ++t) {
      const int64_t count = out.offsets[t + 1] - out.offsets[t];
      ::tensorflow::Tensor *indices = nullptr, *values = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(t, ::tensorflow::TensorShape({count}), &indices));
      OP_REQUIRES_OK(ctx, ctx->allocate_output(num_tables_ + t,
                                               ::tensorflow::TensorShape({count, dim}), &values));
      out.indices.push_back(reinterpret_cast<int64_t*>(indices->flat<TfInt64>().data()));
      out.values.push_back(const_cast<char*>(values->tensor_data().data()));
    }
    OP_REQUIRES_OK(ctx, GroupedGatherGradFunctor<Device>()(ctx, keys, grads, permutation, out));
  }

 private:
  int num_tables_ = 1;
  bool padded_ = false;
};

}  // namespace sharding_kernels
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_SHARDING_KERNELS_SHARDING_OP_H_
