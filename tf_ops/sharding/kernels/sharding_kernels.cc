// The sharding ops on the CPU: the functors of SokBucketizeByOwner,
// SokLocalRows, SokRouteGroupedKeys (over tf_ops/sharding/core) and the
// grouped gather and its gradient (sharding_op.h).
#include <cstring>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "compat/tf_compat.h"
#include "tf_ops/sharding/core/bucketize.h"
#include "tf_ops/sharding/core/route_keys.h"
#include "tf_ops/sharding/kernels/sharding_args.h"
#include "tf_ops/sharding/kernels/sharding_op.h"

namespace sok_graph {
namespace sharding_kernels {

using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;

template <typename K>
struct BucketizeFunctor<CpuDevice, K> {
  Status operator()(OpKernelContext* ctx, const Tensor& ids, int world_size, int fixed_owner,
                    bool check_negative, const Buckets& out) const {
    TF_RETURN_IF_ERROR(CheckNonNegative(ids.flat<K>().data(), ids.NumElements()));
    core::BucketizeByOwner(ids.flat<K>().data(), ids.NumElements(), world_size, fixed_owner,
                           out.bucketed->flat<K>().data(), out.sizes, out.perm, out.inverse);
    return OkStatus();
  }
};

template <typename K>
struct LocalRowsFunctor<CpuDevice, K> {
  Status operator()(OpKernelContext* ctx, const Tensor& ids, int world_size, Tensor* out) const {
    TF_RETURN_IF_ERROR(CheckNonNegative(ids.flat<K>().data(), ids.NumElements()));
    const K* in = ids.flat<K>().data();
    K* dst = out->flat<K>().data();
    ParallelFor(ctx, ids.NumElements(), 4, [&](int64_t begin, int64_t end) {
      core::LocalRows(in, begin, end, world_size, dst);
    });
    return OkStatus();
  }
};

#define SOK_REGISTER_SHARDING(K)                                                          \
  REGISTER_KERNEL_BUILDER(                                                                \
      Name("SokBucketizeByOwner").Device(::tensorflow::DEVICE_CPU).TypeConstraint<K>("T"), \
      BucketizeByOwnerOp<CpuDevice, K>);                                                  \
  REGISTER_KERNEL_BUILDER(                                                                \
      Name("SokLocalRows").Device(::tensorflow::DEVICE_CPU).TypeConstraint<K>("T"),        \
      LocalRowsOp<CpuDevice, K>);
SOK_REGISTER_SHARDING(int32_t)
SOK_REGISTER_SHARDING(TfInt64)
#undef SOK_REGISTER_SHARDING

template <>
struct RouteFunctor<CpuDevice> {
  Status operator()(OpKernelContext* ctx, const RouteArgs& a) const {
    for (int64_t i = 0; i < a.n; ++i) {
      if (a.tables[i] < 0 || a.tables[i] >= a.num_tables) {
        return ::tensorflow::errors::InvalidArgument(
            "tables must be in [0, num_tables=", a.num_tables, "); got ",
            static_cast<int64_t>(a.tables[i]), " at position ", i);
      }
    }
    core::RouteGroupedKeys(a.ids, a.tables, a.n, a.num_tables, a.world_size, a.fixed_owner,
                           a.sent, a.sizes, a.slots);
    return OkStatus();
  }
};

REGISTER_KERNEL_BUILDER(Name("SokRouteGroupedKeys").Device(::tensorflow::DEVICE_CPU),
                        RouteGroupedKeysOp<CpuDevice>);

template <>
struct GroupedGatherFunctor<CpuDevice> {
  Status operator()(OpKernelContext* ctx, const GroupedTables& tables, const Tensor& keys,
                    Tensor* out) const {
    const int64_t* k = reinterpret_cast<const int64_t*>(keys.flat<TfInt64>().data());
    const int64_t n = keys.NumElements();
    const int64_t count = static_cast<int64_t>(tables.rows.size());
    const auto bad = [&](int64_t i) {
      return k[i] < 0 || k[i] / count >= tables.counts[k[i] % count];
    };
    for (int64_t i = 0; i < n && !tables.padded_keys; ++i) {  // no row copied for bad input
      const int64_t t = k[i] >= 0 ? k[i] % count : 0;
      if (bad(i)) {
        return ::tensorflow::errors::InvalidArgument(
            "keys[", i, "]=", k[i], " names row ", k[i] < 0 ? -1 : k[i] / count, " of ",
            GroupedTableName(tables.names, static_cast<int>(t)), ", which has ", tables.counts[t],
            " rows (a key is row * num_tables + table, num_tables=", count, ")");
      }
    }
    char* dst = const_cast<char*>(out->tensor_data().data());
    const int64_t bytes = tables.row_bytes;
    ParallelFor(ctx, n, bytes, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        if (bad(i)) {  // padding (only with padded_keys: checked above otherwise)
          std::memset(dst + i * bytes, 0, static_cast<size_t>(bytes));
        } else {
          std::memcpy(dst + i * bytes, tables.rows[k[i] % count] + (k[i] / count) * bytes,
                      static_cast<size_t>(bytes));
        }
      }
    });
    return OkStatus();
  }
};

template <>
struct GroupedGatherGradFunctor<CpuDevice> {
  Status operator()(OpKernelContext* ctx, const Tensor& keys, const Tensor& grads,
                    const Tensor& permutation, const GroupedGrads& out) const {
    const int64_t* k = reinterpret_cast<const int64_t*>(keys.flat<TfInt64>().data());
    const int64_t* perm = reinterpret_cast<const int64_t*>(permutation.flat<TfInt64>().data());
    const char* src = grads.tensor_data().data();
    const int num_tables = static_cast<int>(out.indices.size());
    const int64_t bytes = out.row_bytes;
    const int64_t n = keys.NumElements();
    for (int t = 0; t < num_tables; ++t) {
      for (int64_t p = out.offsets[t]; p < out.offsets[t + 1]; ++p) {
        const int64_t i = perm[p];
        if (i < 0 || i >= n || k[i] < 0 || k[i] % num_tables != t) {
          return ::tensorflow::errors::InvalidArgument(
              "permutation must group the keys by table (key % num_tables, num_tables=",
              num_tables, ") in the order of table_sizes; permutation[", p, "]=", i,
              " in table ", t, "'s part", i >= 0 && i < n ? " names key " : "",
              i >= 0 && i < n ? std::to_string(k[i]) : std::string());
        }
        const int64_t j = p - out.offsets[t];
        out.indices[t][j] = k[i] / num_tables;
        std::memcpy(out.values[t] + j * bytes, src + i * bytes, static_cast<size_t>(bytes));
      }
    }
    return OkStatus();
  }
};

#define SOK_REGISTER_GROUPED_GATHER(T)                                                    \
  REGISTER_KERNEL_BUILDER(                                                                \
      Name("SokGroupedGather").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),    \
      GroupedGatherOp<CpuDevice, T>);                                                     \
  REGISTER_KERNEL_BUILDER(                                                                \
      Name("SokGroupedGatherGrad").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      GroupedGatherGradOp<CpuDevice, T>);
SOK_REGISTER_GROUPED_GATHER(float)
SOK_REGISTER_GROUPED_GATHER(double)
SOK_REGISTER_GROUPED_GATHER(Eigen::half)
SOK_REGISTER_GROUPED_GATHER(::tensorflow::bfloat16)
#undef SOK_REGISTER_GROUPED_GATHER

}  // namespace sharding_kernels
}  // namespace sok_graph
