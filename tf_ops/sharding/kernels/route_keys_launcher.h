// C launcher of SokRouteGroupedKeys on the GPU (route_keys.cu; plain C, like
// the other launchers of this family).
#ifndef SOK_GRAPH_TF_OPS_SHARDING_KERNELS_ROUTE_KEYS_LAUNCHER_H_
#define SOK_GRAPH_TF_OPS_SHARDING_KERNELS_ROUTE_KEYS_LAUNCHER_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// core::RouteGroupedKeys (tf_ops/sharding/core/route_keys.h) on the GPU, for
// n < 2^30 ids: sent [n], sizes [world_size] and slots [n] as it says, the
// same values (the full-set unique keeps the order of first appearance, the
// bucketing is stable). A table outside [0, num_tables) is read modulo
// num_tables. Nothing is read back: the work is queued on
// `stream` and the call returns. Call with temp == NULL to get *temp_bytes,
// then with that much device scratch. Returns a cudaError_t.
int sok_route_grouped_keys(const int64_t* ids, const int64_t* tables, int64_t n,
                           int64_t num_tables, int64_t world_size, int64_t fixed_owner,
                           int64_t* sent, int64_t* sizes, int64_t* slots, void* temp,
                           size_t* temp_bytes, void* stream);

#ifdef __cplusplus
}
#endif

#endif  // SOK_GRAPH_TF_OPS_SHARDING_KERNELS_ROUTE_KEYS_LAUNCHER_H_
