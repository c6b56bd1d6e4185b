// C launchers of the util family's CUDA kernels (plain C: the .cu compiles
// without TensorFlow headers, and tests/gpu calls it through ctypes).
//
// Both follow one pattern for scratch memory: call first with temp == NULL
// to get *temp_bytes, then again with that much device memory. Each returns
// a cudaError_t (0 on success). Nothing here waits for the stream: outputs
// whose size depends on the data are written into buffers of the largest
// possible size, with the size left in device memory.
#ifndef SOK_GRAPH_TF_OPS_UTIL_KERNELS_UTIL_LAUNCHER_H_
#define SOK_GRAPH_TF_OPS_UTIL_KERNELS_UTIL_LAUNCHER_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// tf.unique_with_counts on the GPU: y <- distinct values of x [n] in order
// of first appearance (y has room for n; *num_unique, a device int64, says
// how many are valid), idx[i] <- index of x[i] in y, count[k] <- occurrences
// of y[k] (room for n; NULL: not counted, as tf.unique, which saves an
// atomic per warp of keys). Deterministic. n < 2^30 (cudaErrorInvalidValue
// otherwise); the scratch is 16 bytes (int64 keys) or 12 (int32) per slot
// of a hash set of 2n to 4n slots, plus 12 bytes per key.
int sok_unique_with_counts_i64_i32(const int64_t* x, int64_t n, int64_t* y, int32_t* idx,
                                   int32_t* count, int64_t* num_unique, void* temp,
                                   size_t* temp_bytes, void* stream);
int sok_unique_with_counts_i64_i64(const int64_t* x, int64_t n, int64_t* y, int64_t* idx,
                                   int64_t* count, int64_t* num_unique, void* temp,
                                   size_t* temp_bytes, void* stream);
int sok_unique_with_counts_i32_i32(const int32_t* x, int64_t n, int32_t* y, int32_t* idx,
                                   int32_t* count, int64_t* num_unique, void* temp,
                                   size_t* temp_bytes, void* stream);
int sok_unique_with_counts_i32_i64(const int32_t* x, int64_t n, int32_t* y, int64_t* idx,
                                   int64_t* count, int64_t* num_unique, void* temp,
                                   size_t* temp_bytes, void* stream);

// As sok_unique_with_counts_*, with a hash set of set_slots slots (a power
// of two >= 64; 0, or one of at least 2n: the full set) for a caller that
// expects few distinct values: the set's slots are what each call clears.
// More than set_slots / 2 distinct values overflow it: *num_unique is then
// -1 and nothing else is written; call again with set_slots = 0.
// The hash set for a batch of n values after one with `last` distinct
// values (-1: none seen yet): four slots per value, so that a batch alike
// fills a quarter of it; 0 (the full set) when that is no smaller.
static inline int64_t sok_unique_set_slots_after(int64_t last, int64_t n) {
  int64_t slots = 64;
  if (last < 0) return 0;
  while (slots < 4 * last) slots *= 2;
  return slots < 2 * n ? slots : 0;
}

int sok_unique_in_set_i64_i32(const int64_t* x, int64_t n, int64_t set_slots, int64_t* y,
                              int32_t* idx, int32_t* count, int64_t* num_unique, void* temp,
                              size_t* temp_bytes, void* stream);
int sok_unique_in_set_i64_i64(const int64_t* x, int64_t n, int64_t set_slots, int64_t* y,
                              int64_t* idx, int64_t* count, int64_t* num_unique, void* temp,
                              size_t* temp_bytes, void* stream);
int sok_unique_in_set_i32_i32(const int32_t* x, int64_t n, int64_t set_slots, int32_t* y,
                              int32_t* idx, int32_t* count, int64_t* num_unique, void* temp,
                              size_t* temp_bytes, void* stream);
int sok_unique_in_set_i32_i64(const int32_t* x, int64_t n, int64_t set_slots, int32_t* y,
                              int64_t* idx, int64_t* count, int64_t* num_unique, void* temp,
                              size_t* temp_bytes, void* stream);

// After a unique of n keys: sizes[g] (g < groups, device int64s) <- how many
// of the *num_unique distinct values y holds (a device int64, negative for
// none) are in group g, the value mod groups (floor modulo).
int sok_unique_group_sizes_i64(const int64_t* y, const int64_t* num_unique, int64_t n,
                               int64_t groups, int64_t* sizes, void* stream);

// After a unique of n keys: y[i] <- value for i >= *num_unique (a device
// int64), the positions past its distinct values.
int sok_unique_pad_i64(int64_t* y, const int64_t* num_unique, int64_t n, int64_t value,
                       void* stream);

// tf.math.unsorted_segment_sum for float data [n, width] and 1-D segment ids:
// out [num_segments, width] (every row written; empty segments are zero).
// Negative ids are dropped. Ids >= num_segments are an error: *first_bad
// (a device int64 the caller sets to INT64_MAX) receives the smallest such
// position, and those positions are dropped; with first_bad null they are
// dropped unchecked (ids in range by construction). Each segment is summed in
// increasing position order, in pieces as tf_ops/util/core/segment_sum.h
// says, so results are deterministic and equal to the CPU kernel's. n and
// num_segments + 1 (when anything is summed) at most INT_MAX.
int sok_unsorted_segment_sum_f32_i32(const float* data, const int32_t* segment_ids, int64_t n,
                                     int64_t width, int64_t num_segments, float* out,
                                     int64_t* first_bad, void* temp, size_t* temp_bytes,
                                     void* stream);
int sok_unsorted_segment_sum_f32_i64(const float* data, const int64_t* segment_ids, int64_t n,
                                     int64_t width, int64_t num_segments, float* out,
                                     int64_t* first_bad, void* temp, size_t* temp_bytes,
                                     void* stream);

#ifdef __cplusplus
}
#endif

#endif  // SOK_GRAPH_TF_OPS_UTIL_KERNELS_UTIL_LAUNCHER_H_
