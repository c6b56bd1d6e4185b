// C launchers of SokGroupedGather's and SokGroupedGatherGrad's CUDA kernels
// (grouped_gather.cu). Both copy rows as raw bytes: they serve every float
// dtype alike (row_bytes even), in units of at most max_unit_bytes (a power
// of two that divides the address of every buffer they are given). Each returns a cudaError_t (0 on success) and queues its work
// on `stream` (a cudaStream_t).
#ifndef SOK_GRAPH_TF_OPS_SHARDING_KERNELS_GROUPED_GATHER_LAUNCHER_H_
#define SOK_GRAPH_TF_OPS_SHARDING_KERNELS_GROUPED_GATHER_LAUNCHER_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// out[i] = row keys[i] / num_tables of table keys[i] % num_tables, each row
// row_bytes long. tables (device): for table t, tables[2t] is the address of
// its rows and tables[2t + 1] their count. A negative key, or one whose row
// is outside its table, gives a zero row.
int sok_grouped_gather(const int64_t* tables, int num_tables, const int64_t* keys, int64_t n,
                       int64_t row_bytes, int max_unit_bytes, void* out, void* stream);

// For each table t and j < its count: indices_t[j] = keys[p] / num_tables and
// values_t[j] = grads[p] (a row_bytes row), where p = permutation[offsets[t]
// + j]. outputs (device): offsets[0..num_tables] (offsets[num_tables] = n),
// then the addresses of indices_0..indices_{num_tables-1}, then those of
// values_0..values_{num_tables-1}. A position whose key does not belong to
// table t gets index -1 and a zero row.
int sok_grouped_gather_grad(const int64_t* outputs, int num_tables, const int64_t* keys,
                            const int64_t* permutation, int64_t n, const void* grads,
                            int64_t row_bytes, int max_unit_bytes, void* stream);

#ifdef __cplusplus
}
#endif

#endif  // SOK_GRAPH_TF_OPS_SHARDING_KERNELS_GROUPED_GATHER_LAUNCHER_H_
