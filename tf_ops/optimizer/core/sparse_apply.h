// The sparse optimizer updates of SokSparseApply and SokDynamicSparseApply,
// one element of one row at a time, for every algorithm of
// sok_graph/optimization/algorithms.py: the same formulas as its TensorFlow-op
// updates (the path of tables that are not float32), so a fused step equals
// that step. One header for the CPU kernels and the CUDA launcher.
//
// Rows are touched once per step (the caller passes distinct indices), so
// each element's update reads and writes only its own table and slot cells.
#ifndef SOK_GRAPH_TF_OPS_OPTIMIZER_CORE_SPARSE_APPLY_H_
#define SOK_GRAPH_TF_OPS_OPTIMIZER_CORE_SPARSE_APPLY_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#if defined(__CUDACC__)
#define SOK_OPT_HOST_DEVICE __host__ __device__
#else
#define SOK_OPT_HOST_DEVICE
#endif

namespace sok_graph {
namespace core {

// The fused algorithms; the GPU launcher takes them as these ints. RMSprop
// is four: its slots depend on whether it has momentum and is centered.
enum class SparseAlgorithm : int32_t {
  kSgd = 0, kMomentum = 1, kAdagrad = 2, kAdam = 3, kFtrl = 4, kRmsprop = 5,
  kRmspropMomentum = 6, kRmspropCentered = 7, kRmspropMomentumCentered = 8, kAdadelta = 9,
  kAdamax = 10
};

// The most slots an algorithm keeps per row (centered RMSprop with momentum).
constexpr int kMaxSlots = 3;

// The hyperparameters, in the order of the op's `hyper` input.
enum HyperIndex : int {
  kLr = 0, kMomentumCoef, kEpsilon, kBeta1, kBeta2, kLrPower, kL1, kL2, kL2Shrinkage, kBeta,
  kRho, kNumHyper
};

// The one list of what the fused update's callers must agree on: each
// algorithm's name and slots (in the order the op takes them) and the
// hyperparameters' names (in HyperIndex order). The op registrations spell
// them out from here (attributes `algorithm`, `slot_names`, `hyper_names`);
// sok_graph's Python side reads them back from the registered ops when it
// first builds an update (optimization/fused_apply.py), and the kernels
// refuse a graph whose attributes name other lists.
struct AlgorithmSpec {
  const char* name;
  SparseAlgorithm algorithm;
  const char* slots;  // comma-separated, in the op's order
};
constexpr AlgorithmSpec kAlgorithmSpecs[] = {
    {"sgd", SparseAlgorithm::kSgd, ""},
    {"momentum", SparseAlgorithm::kMomentum, "momentum"},
    {"adagrad", SparseAlgorithm::kAdagrad, "accumulator"},
    {"adam", SparseAlgorithm::kAdam, "m,v"},
    {"ftrl", SparseAlgorithm::kFtrl, "accumulator,linear"},
    {"rmsprop", SparseAlgorithm::kRmsprop, "rms"},
    {"rmsprop_momentum", SparseAlgorithm::kRmspropMomentum, "rms,momentum"},
    {"rmsprop_centered", SparseAlgorithm::kRmspropCentered, "rms,mg"},
    {"rmsprop_momentum_centered", SparseAlgorithm::kRmspropMomentumCentered, "rms,momentum,mg"},
    {"adadelta", SparseAlgorithm::kAdadelta, "accum,accum_update"},
    {"adamax", SparseAlgorithm::kAdamax, "m,v"},
};
constexpr const char* kHyperNames[kNumHyper] = {
    "lr", "momentum", "epsilon", "beta_1", "beta_2", "lr_power", "l1", "l2", "l2_shrinkage",
    "beta", "rho"};

// The names in a comma-separated list ("" has none).
constexpr int CountNames(const char* list) {
  int n = 0;
  bool in_name = false;
  for (; *list != '\0'; ++list) {
    if (*list == ',') {
      in_name = false;
    } else if (!in_name) {
      in_name = true;
      ++n;
    }
  }
  return n;
}

// Slots each algorithm keeps per row.
constexpr int SlotCount(SparseAlgorithm a) {
  for (const auto& spec : kAlgorithmSpecs) {
    if (spec.algorithm == a) return CountNames(spec.slots);
  }
  return -1;
}
static_assert(SlotCount(SparseAlgorithm::kAdam) == 2 && SlotCount(SparseAlgorithm::kSgd) == 0,
              "slot counts come from the slot names");

constexpr bool SlotsFit() {
  for (const auto& spec : kAlgorithmSpecs) {
    if (CountNames(spec.slots) > kMaxSlots) return false;
  }
  return true;
}
static_assert(SlotsFit(), "an algorithm keeps more than kMaxSlots slots");

inline bool ParseSparseAlgorithm(const char* name, SparseAlgorithm* out) {
  for (const auto& spec : kAlgorithmSpecs) {
    if (std::strcmp(spec.name, name) == 0) {
      *out = spec.algorithm;
      return true;
    }
  }
  return false;
}

// "name:slot,slot" per algorithm, and the hyperparameters' names.
inline std::vector<std::string> SlotNames() {
  std::vector<std::string> out;
  for (const auto& spec : kAlgorithmSpecs) out.push_back(std::string(spec.name) + ":" + spec.slots);
  return out;
}
inline std::vector<std::string> HyperNames() {
  return std::vector<std::string>(kHyperNames, kHyperNames + kNumHyper);
}

// The op attributes that spell the lists out, for REGISTER_OP.
inline std::string QuotedList(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "'" : ", '") + item + "'";
  return out;
}
inline std::string AlgorithmAttr() {
  std::vector<std::string> names;
  for (const auto& spec : kAlgorithmSpecs) names.push_back(spec.name);
  return "algorithm: {" + QuotedList(names) + "}";
}
inline std::string SlotNamesAttr() {
  return "slot_names: list(string) = [" + QuotedList(SlotNames()) + "]";
}
inline std::string HyperNamesAttr() {
  return "hyper_names: list(string) = [" + QuotedList(HyperNames()) + "]";
}

// Empty, or why a graph's `slot_names` / `hyper_names` attributes (the
// lists it was built against) differ from this library's.
inline std::string SpecMismatch(const std::vector<std::string>& slot_names,
                                const std::vector<std::string>& hyper_names) {
  if (slot_names != SlotNames()) {
    return "the graph's slot_names [" + QuotedList(slot_names) + "] differ from this " +
           "library's [" + QuotedList(SlotNames()) + "]";
  }
  if (hyper_names != HyperNames()) {
    return "the graph's hyper_names [" + QuotedList(hyper_names) + "] differ from this " +
           "library's [" + QuotedList(HyperNames()) + "]";
  }
  return std::string();
}

// Whose formulas an update follows where the optimizer families differ
// (SparseApplyConfig::formulas; the ops' attributes `tf1` and
// `keras_optimizer_v2` select it, and the GPU launchers take it as this int).
enum SparseFormulas : int32_t {
  // Keras 3 and Keras 2's Optimizer: Adagrad and RMSprop divide by
  // sqrt(x + epsilon).
  kKerasFormulas = 0,
  // tf.compat.v1.train: momentum accumulates gradients, Adagrad has no
  // epsilon.
  kTf1Formulas = 1,
  // Keras 2's OptimizerV2 (its legacy optimizers; all of Keras on TF 1.x):
  // Adagrad and RMSprop without momentum divide by sqrt(x) + epsilon, as
  // its ResourceSparseApplyAdagradV2 and its own RMSprop ops do; otherwise
  // Keras' formulas.
  kKerasV2Formulas = 2,
};

struct SparseApplyConfig {
  int32_t algorithm;  // SparseAlgorithm
  int32_t formulas;   // SparseFormulas
  int32_t nesterov;
};

// Adam's step size for step t (1-based): lr * sqrt(1 - b2^t) / (1 - b1^t).
SOK_OPT_HOST_DEVICE inline float AdamAlpha(const float* h, int64_t step) {
  const float t = static_cast<float>(step);
  return h[kLr] * sqrtf(1.0f - powf(h[kBeta2], t)) / (1.0f - powf(h[kBeta1], t));
}

// The step size the bias-corrected algorithms use for step t (1-based),
// computed once per update: Adam's AdamAlpha, Adamax's lr / (1 - b1^t); 0
// for the others.
SOK_OPT_HOST_DEVICE inline float StepAlpha(int32_t algorithm, const float* h, int64_t step) {
  switch (static_cast<SparseAlgorithm>(algorithm)) {
    case SparseAlgorithm::kAdam:
      return AdamAlpha(h, step);
    case SparseAlgorithm::kAdamax:
      return h[kLr] / (1.0f - powf(h[kBeta1], static_cast<float>(step)));
    default:
      return 0.0f;
  }
}

// x^p for FTRL's accumulators. Its learning_rate_power is -0.5 by default
// in every optimizer family, so p is usually 0.5: a square root (one
// instruction, exactly rounded) instead of powf, a library call per element
// that kept the fused CPU update slower than TensorFlow's vectorized pow.
SOK_OPT_HOST_DEVICE inline float PowerOf(float x, float p) {
  return p == 0.5f ? sqrtf(x) : powf(x, p);
}

// RMSprop on one element; s_mom and s_mg are null where the variant keeps
// no momentum or is not centered.
// Keras 2's OptimizerV2 adds epsilon after the root where it keeps no
// momentum (kKerasV2Formulas).
SOK_OPT_HOST_DEVICE inline void RmspropElement(const float* h, float g, float* w, float* s_rms,
                                               float* s_mom, float* s_mg, int32_t formulas) {
  const float rho = h[kRho];
  const float ms = rho * *s_rms + (1.0f - rho) * g * g;
  *s_rms = ms;
  const bool epsilon_after_root = formulas == kKerasV2Formulas && s_mom == nullptr;
  float denom = epsilon_after_root ? ms : ms + h[kEpsilon];
  if (s_mg != nullptr) {
    const float mg = rho * *s_mg + (1.0f - rho) * g;
    *s_mg = mg;
    denom = denom - mg * mg;
  }
  const float inc =
      epsilon_after_root ? h[kLr] * g / (sqrtf(denom) + h[kEpsilon]) : h[kLr] * g / sqrtf(denom);
  if (s_mom != nullptr) {
    const float mom = h[kMomentumCoef] * *s_mom + inc;
    *s_mom = mom;
    *w = *w - mom;
  } else {
    *w = *w - inc;
  }
}

// Updates one element: w (the table), s0, s1 and s2 (its slots, as the
// algorithm has them) from gradient g. `alpha` is StepAlpha.
SOK_OPT_HOST_DEVICE inline void ApplyElement(const SparseApplyConfig& c, const float* h,
                                             float alpha, float g, float* w, float* s0,
                                             float* s1, float* s2) {
  const float lr = h[kLr];
  switch (static_cast<SparseAlgorithm>(c.algorithm)) {
    case SparseAlgorithm::kSgd:
      *w = *w - lr * g;
      return;
    case SparseAlgorithm::kMomentum: {
      const float m = h[kMomentumCoef];
      if (c.formulas == kTf1Formulas) {  // accumulation = m * accumulation + g
        const float acc = m * *s0 + g;
        *s0 = acc;
        *w = *w - (c.nesterov ? lr * g + lr * m * acc : lr * acc);
      } else {  // velocity = m * velocity - lr * g
        const float vel = m * *s0 - lr * g;
        *s0 = vel;
        *w = c.nesterov ? *w + m * vel - lr * g : *w + vel;
      }
      return;
    }
    case SparseAlgorithm::kAdagrad: {
      const float acc = *s0 + g * g;
      *s0 = acc;
      const float denom = c.formulas == kTf1Formulas      ? sqrtf(acc)
                          : c.formulas == kKerasV2Formulas ? sqrtf(acc) + h[kEpsilon]
                                                           : sqrtf(acc + h[kEpsilon]);
      *w = *w - lr * g / denom;
      return;
    }
    case SparseAlgorithm::kAdam: {
      const float b1 = h[kBeta1], b2 = h[kBeta2];
      const float m = b1 * *s0 + (1.0f - b1) * g;
      const float v = b2 * *s1 + (1.0f - b2) * g * g;
      *s0 = m;
      *s1 = v;
      *w = *w - alpha * m / (sqrtf(v) + h[kEpsilon]);
      return;
    }
    case SparseAlgorithm::kFtrl: {
      const float p = -h[kLrPower];
      const float acc = *s0, new_acc = acc + g * g;
      const float x = *w;
      const float g_shrunk = g + 2.0f * h[kL2Shrinkage] * x;
      const float pow_new = PowerOf(new_acc, p);
      const float lin = *s1 + g_shrunk - (pow_new - PowerOf(acc, p)) / lr * x;
      const float quad = pow_new / lr + 2.0f * (h[kL2] + h[kBeta] / (2.0f * lr));
      const float l1 = h[kL1];
      const float clipped = lin < -l1 ? -l1 : (lin > l1 ? l1 : lin);
      *s0 = new_acc;
      *s1 = lin;
      *w = (clipped - lin) / quad;
      return;
    }
    case SparseAlgorithm::kRmsprop:
      RmspropElement(h, g, w, s0, nullptr, nullptr, c.formulas);
      return;
    case SparseAlgorithm::kRmspropMomentum:
      RmspropElement(h, g, w, s0, s1, nullptr, c.formulas);
      return;
    case SparseAlgorithm::kRmspropCentered:
      RmspropElement(h, g, w, s0, nullptr, s1, c.formulas);
      return;
    case SparseAlgorithm::kRmspropMomentumCentered:
      RmspropElement(h, g, w, s0, s1, s2, c.formulas);
      return;
    case SparseAlgorithm::kAdadelta: {
      const float rho = h[kRho], eps = h[kEpsilon];
      const float acc = rho * *s0 + (1.0f - rho) * g * g;
      const float upd = sqrtf(*s1 + eps) / sqrtf(acc + eps) * g;
      *s0 = acc;
      *s1 = rho * *s1 + (1.0f - rho) * upd * upd;
      *w = *w - lr * upd;
      return;
    }
    case SparseAlgorithm::kAdamax: {
      const float b1 = h[kBeta1], b2 = h[kBeta2];
      const float m = b1 * *s0 + (1.0f - b1) * g;
      const float decayed = b2 * *s1, magnitude = fabsf(g);
      const float u = decayed > magnitude ? decayed : magnitude;
      *s0 = m;
      *s1 = u;
      *w = *w - alpha * m / (u + h[kEpsilon]);
      return;
    }
  }
}

#if defined(__CUDACC__)
// Block-wide, before a kernel's first update: the hyperparameters (device
// memory: the host never reads them) into the block's shared `hyper`, and
// the step size of the bias-corrected algorithms into its shared `alpha`.
// Every thread of the block must call it.
__device__ __forceinline__ void LoadHyperIntoBlock(const SparseApplyConfig& config,
                                                   const float* hyper_dev, const int64_t* step,
                                                   float* hyper, float* alpha) {
  if (threadIdx.x < kNumHyper) hyper[threadIdx.x] = hyper_dev[threadIdx.x];
  __syncthreads();
  if (threadIdx.x == 0) *alpha = StepAlpha(config.algorithm, hyper, *step);
  __syncthreads();
}
#endif

}  // namespace core
}  // namespace sok_graph

#endif  // SOK_GRAPH_TF_OPS_OPTIMIZER_CORE_SPARSE_APPLY_H_
