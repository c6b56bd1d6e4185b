// C launcher of the GPU bucketing by owner (plain C, like local_rows_launcher.h).
#ifndef SOK_GRAPH_TF_OPS_SHARDING_KERNELS_BUCKETIZE_LAUNCHER_H_
#define SOK_GRAPH_TF_OPS_SHARDING_KERNELS_BUCKETIZE_LAUNCHER_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// core::BucketizeByOwner on the GPU: a stable grouping of ids [n] by owner
// (fixed_owner if >= 0, else id % world_size):
//   bucketed[k] = ids[permutation[k]], owners non-decreasing along k;
//   inverse[permutation[k]] = k;  sizes[w] = ids owned by worker w.
// Ids must be >= 0: *first_negative (a device int64 the caller sets to
// INT64_MAX) receives the smallest position of a negative id, if any (the
// outputs are then meaningless). Call with temp == NULL to get *temp_bytes,
// then with that much device scratch. Returns a cudaError_t.
int sok_bucketize_by_owner_i64(const int64_t* ids, int64_t n, int64_t world_size,
                               int64_t fixed_owner, int64_t* bucketed, int64_t* sizes,
                               int64_t* permutation, int64_t* inverse, int64_t* first_negative,
                               void* temp, size_t* temp_bytes, void* stream);
int sok_bucketize_by_owner_i32(const int32_t* ids, int64_t n, int64_t world_size,
                               int64_t fixed_owner, int32_t* bucketed, int64_t* sizes,
                               int64_t* permutation, int64_t* inverse, int64_t* first_negative,
                               void* temp, size_t* temp_bytes, void* stream);

#ifdef __cplusplus
}
#endif

#endif  // SOK_GRAPH_TF_OPS_SHARDING_KERNELS_BUCKETIZE_LAUNCHER_H_
