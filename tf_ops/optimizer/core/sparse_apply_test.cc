// Tests for tf_ops/optimizer/core/sparse_apply.h against the algorithms'
// textbook forms, written out here in double precision.
#include "tf_ops/optimizer/core/sparse_apply.h"

#include <algorithm>
#include <cmath>

#include "gtest/gtest.h"

namespace sok_graph {
namespace core {
namespace {

struct Cell {
  float w, s0, s1, s2;
};

void Hyper(float* h) {
  h[kLr] = 0.1f; h[kMomentumCoef] = 0.9f; h[kEpsilon] = 1e-7f; h[kBeta1] = 0.8f;
  h[kBeta2] = 0.95f; h[kLrPower] = -0.5f; h[kL1] = 0.01f; h[kL2] = 0.02f;
  h[kL2Shrinkage] = 0.03f; h[kBeta] = 0.5f; h[kRho] = 0.85f;
}

// formulas: a SparseFormulas (0 Keras, 1 tf.compat.v1, 2 Keras 2's OptimizerV2).
Cell Step(SparseAlgorithm a, int formulas, int nesterov, Cell c, float g, int64_t step = 1) {
  float h[kNumHyper];
  Hyper(h);
  SparseApplyConfig config{static_cast<int32_t>(a), formulas, nesterov};
  ApplyElement(config, h, StepAlpha(config.algorithm, h, step), g, &c.w, &c.s0, &c.s1, &c.s2);
  return c;
}

TEST(SparseApplyTest, Sgd) {
  EXPECT_FLOAT_EQ(Step(SparseAlgorithm::kSgd, 0, 0, {1.0f, 0, 0, 0.0f}, 2.0f).w,
                  1.0f - 0.1f * 2.0f);
}

TEST(SparseApplyTest, MomentumBothFlavours) {
  // tf.compat.v1.train.MomentumOptimizer: acc = m acc + g; w -= lr acc.
  Cell c = Step(SparseAlgorithm::kMomentum, 1, 0, {1.0f, 0.5f, 0, 0.0f}, 2.0f);
  EXPECT_NEAR(c.s0, 0.9 * 0.5 + 2.0, 1e-6);
  EXPECT_NEAR(c.w, 1.0 - 0.1 * (0.9 * 0.5 + 2.0), 1e-6);
  // Nesterov (TF1): w -= lr g + lr m acc.
  c = Step(SparseAlgorithm::kMomentum, 1, 1, {1.0f, 0.5f, 0, 0.0f}, 2.0f);
  EXPECT_NEAR(c.w, 1.0 - (0.1 * 2.0 + 0.1 * 0.9 * (0.9 * 0.5 + 2.0)), 1e-6);
  // Keras SGD(momentum): v = m v - lr g; w += v.
  c = Step(SparseAlgorithm::kMomentum, 0, 0, {1.0f, 0.5f, 0, 0.0f}, 2.0f);
  EXPECT_NEAR(c.s0, 0.9 * 0.5 - 0.1 * 2.0, 1e-6);
  EXPECT_NEAR(c.w, 1.0 + (0.9 * 0.5 - 0.1 * 2.0), 1e-6);
  c = Step(SparseAlgorithm::kMomentum, 0, 1, {1.0f, 0.5f, 0, 0.0f}, 2.0f);
  EXPECT_NEAR(c.w, 1.0 + 0.9 * (0.9 * 0.5 - 0.1 * 2.0) - 0.1 * 2.0, 1e-6);
}

TEST(SparseApplyTest, AdagradEpsilonOnlyInKeras) {
  Cell c = Step(SparseAlgorithm::kAdagrad, 1, 0, {1.0f, 0.1f, 0, 0.0f}, 2.0f);
  EXPECT_NEAR(c.s0, 4.1, 1e-6);
  EXPECT_NEAR(c.w, 1.0 - 0.1 * 2.0 / std::sqrt(4.1), 1e-6);
  c = Step(SparseAlgorithm::kAdagrad, 0, 0, {1.0f, 0.1f, 0, 0.0f}, 2.0f);
  EXPECT_NEAR(c.w, 1.0 - 0.1 * 2.0 / std::sqrt(4.1 + 1e-7), 1e-6);
}

TEST(SparseApplyTest, AdamBiasCorrectedStep) {
  const double b1 = 0.8, b2 = 0.95, g = 2.0;
  for (int64_t t : {1, 2, 10}) {
    Cell c = Step(SparseAlgorithm::kAdam, 0, 0, {1.0f, 0.3f, 0.4f, 0.0f}, 2.0f, t);
    const double m = b1 * 0.3 + (1 - b1) * g, v = b2 * 0.4 + (1 - b2) * g * g;
    const double alpha = 0.1 * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
    EXPECT_NEAR(c.s0, m, 1e-6);
    EXPECT_NEAR(c.s1, v, 1e-6);
    EXPECT_NEAR(c.w, 1.0 - alpha * m / (std::sqrt(v) + 1e-7), 1e-5) << "step " << t;
  }
}

TEST(SparseApplyTest, FtrlProximalStep) {
  // McMahan et al.'s FTRL-Proximal with TF's l2 shrinkage and Keras' beta.
  const double lr = 0.1, acc = 0.2, lin = 0.05, w = 1.0, g = 2.0, p = 0.5;
  const double l1 = 0.01, l2 = 0.02, shrink = 0.03, beta = 0.5;
  Cell c = Step(SparseAlgorithm::kFtrl, 0, 0, {1.0f, 0.2f, 0.05f, 0.0f}, 2.0f);
  const double new_acc = acc + g * g;
  const double new_lin =
      lin + (g + 2 * shrink * w) - (std::pow(new_acc, p) - std::pow(acc, p)) / lr * w;
  const double quad = std::pow(new_acc, p) / lr + 2 * (l2 + beta / (2 * lr));
  const double want = std::fabs(new_lin) <= l1 ? 0.0 : (std::copysign(l1, new_lin) - new_lin) / quad;
  EXPECT_NEAR(c.s0, new_acc, 1e-6);
  EXPECT_NEAR(c.s1, new_lin, 1e-5);
  EXPECT_NEAR(c.w, want, 1e-6);
}

// A learning_rate_power other than -0.5 takes the general power.
TEST(SparseApplyTest, FtrlOtherPowers) {
  for (const float lr_power : {-0.25f, -1.0f, 0.0f}) {
    float h[kNumHyper];
    Hyper(h);
    h[kLrPower] = lr_power;
    const double p = -lr_power, lr = 0.1, acc = 0.2, lin = 0.05, w = 1.0, g = 2.0;
    Cell c{1.0f, 0.2f, 0.05f, 0.0f};
    SparseApplyConfig config{static_cast<int32_t>(SparseAlgorithm::kFtrl), 0, 0};
    ApplyElement(config, h, 0.0f, 2.0f, &c.w, &c.s0, &c.s1, &c.s2);
    const double new_acc = acc + g * g;
    const double new_lin =
        lin + (g + 2 * 0.03 * w) - (std::pow(new_acc, p) - std::pow(acc, p)) / lr * w;
    const double quad = std::pow(new_acc, p) / lr + 2 * (0.02 + 0.5 / (2 * lr));
    const double want =
        std::fabs(new_lin) <= 0.01 ? 0.0 : (std::copysign(0.01, new_lin) - new_lin) / quad;
    EXPECT_NEAR(c.s1, new_lin, 1e-5) << "lr_power " << lr_power;
    EXPECT_NEAR(c.w, want, 1e-6) << "lr_power " << lr_power;
  }
}

TEST(SparseApplyTest, NamesAndSlotCounts) {
  SparseAlgorithm a;
  EXPECT_TRUE(ParseSparseAlgorithm("ftrl", &a));
  EXPECT_EQ(a, SparseAlgorithm::kFtrl);
  EXPECT_EQ(SlotCount(a), 2);
  EXPECT_FALSE(ParseSparseAlgorithm("lamb", &a));
  EXPECT_TRUE(ParseSparseAlgorithm("sgd", &a));
  EXPECT_EQ(SlotCount(a), 0);
  EXPECT_TRUE(ParseSparseAlgorithm("rmsprop_momentum_centered", &a));
  EXPECT_EQ(SlotCount(a), kMaxSlots);
}

// RMSprop's four slot layouts: rms, then momentum if it has one, then the
// mean gradient if centered.
TEST(SparseApplyTest, RmspropVariants) {
  const double rho = 0.85, lr = 0.1, mom = 0.9, eps = 1e-7, g = 2.0;
  const double ms = rho * 0.4 + (1 - rho) * g * g;
  Cell c = Step(SparseAlgorithm::kRmsprop, 0, 0, {1.0f, 0.4f, 0, 0}, 2.0f);
  EXPECT_NEAR(c.s0, ms, 1e-6);
  EXPECT_NEAR(c.w, 1.0 - lr * g / std::sqrt(ms + eps), 1e-6);
  c = Step(SparseAlgorithm::kRmspropMomentum, 0, 0, {1.0f, 0.4f, 0.3f, 0}, 2.0f);
  const double m = mom * 0.3 + lr * g / std::sqrt(ms + eps);
  EXPECT_NEAR(c.s1, m, 1e-6);
  EXPECT_NEAR(c.w, 1.0 - m, 1e-6);
  const double mg = rho * 0.2 + (1 - rho) * g;
  c = Step(SparseAlgorithm::kRmspropCentered, 0, 0, {1.0f, 0.4f, 0.2f, 0}, 2.0f);
  EXPECT_NEAR(c.s1, mg, 1e-6);
  EXPECT_NEAR(c.w, 1.0 - lr * g / std::sqrt(ms + eps - mg * mg), 1e-6);
  c = Step(SparseAlgorithm::kRmspropMomentumCentered, 0, 0, {1.0f, 0.4f, 0.3f, 0.2f}, 2.0f);
  const double mc = mom * 0.3 + lr * g / std::sqrt(ms + eps - mg * mg);
  EXPECT_NEAR(c.s1, mc, 1e-6);
  EXPECT_NEAR(c.s2, mg, 1e-6);
  EXPECT_NEAR(c.w, 1.0 - mc, 1e-6);
}

TEST(SparseApplyTest, KerasOptimizerV2AddsEpsilonAfterTheRoot) {
  // Keras 2's OptimizerV2 Adagrad (ResourceSparseApplyAdagradV2) and its
  // RMSprop without momentum divide by sqrt(x) + epsilon. Small gradients,
  // where that differs from sqrt(x + epsilon) by far.
  const double lr = 0.1, eps = 1e-7, rho = 0.85;
  double g = 1e-4;
  Cell c = Step(SparseAlgorithm::kAdagrad, kKerasV2Formulas, 0, {1.0f, 0.0f, 0, 0}, 1e-4f);
  EXPECT_NEAR(c.s0, g * g, 1e-12);
  EXPECT_NEAR(c.w, 1.0 - lr * g / (std::sqrt(g * g) + eps), 1e-6);
  g = 1e-3;
  const double ms = (1 - rho) * g * g, mg = (1 - rho) * g;
  c = Step(SparseAlgorithm::kRmsprop, kKerasV2Formulas, 0, {1.0f, 0.0f, 0, 0}, 1e-3f);
  EXPECT_NEAR(c.w, 1.0 - lr * g / (std::sqrt(ms) + eps), 1e-6);
  c = Step(SparseAlgorithm::kRmspropCentered, kKerasV2Formulas, 0, {1.0f, 0.0f, 0.0f, 0},
           1e-3f);
  EXPECT_NEAR(c.w, 1.0 - lr * g / (std::sqrt(ms - mg * mg) + eps), 1e-6);
  // With momentum its kernels (ResourceSparseApply[Centered]RMSProp) keep
  // epsilon inside, as Keras does.
  for (int formulas : {kKerasFormulas, kKerasV2Formulas}) {
    c = Step(SparseAlgorithm::kRmspropMomentum, formulas, 0, {1.0f, 0.0f, 0.0f, 0}, 1e-3f);
    EXPECT_NEAR(c.w, 1.0 - lr * g / std::sqrt(ms + eps), 1e-6);
  }
  // The others are Keras' formulas.
  EXPECT_EQ(Step(SparseAlgorithm::kAdam, kKerasV2Formulas, 0, {1.0f, 0.3f, 0.4f, 0}, 2.0f).w,
            Step(SparseAlgorithm::kAdam, kKerasFormulas, 0, {1.0f, 0.3f, 0.4f, 0}, 2.0f).w);
}

TEST(SparseApplyTest, AdadeltaStep) {
  const double rho = 0.85, eps = 1e-7, g = 2.0;
  Cell c = Step(SparseAlgorithm::kAdadelta, 0, 0, {1.0f, 0.4f, 0.3f, 0}, 2.0f);
  const double acc = rho * 0.4 + (1 - rho) * g * g;
  const double upd = std::sqrt(0.3 + eps) / std::sqrt(acc + eps) * g;
  EXPECT_NEAR(c.s0, acc, 1e-6);
  EXPECT_NEAR(c.s1, rho * 0.3 + (1 - rho) * upd * upd, 1e-6);
  EXPECT_NEAR(c.w, 1.0 - 0.1 * upd, 1e-6);
}

TEST(SparseApplyTest, AdamaxBiasCorrectedStep) {
  const double b1 = 0.8, b2 = 0.95, g = -2.0;
  for (int64_t t : {1, 3}) {
    Cell c = Step(SparseAlgorithm::kAdamax, 0, 0, {1.0f, 0.3f, 0.4f, 0}, -2.0f, t);
    const double m = b1 * 0.3 + (1 - b1) * g, u = std::max(b2 * 0.4, std::fabs(g));
    EXPECT_NEAR(c.s0, m, 1e-6);
    EXPECT_NEAR(c.s1, u, 1e-6);
    EXPECT_NEAR(c.w, 1.0 - 0.1 / (1 - std::pow(b1, t)) * m / (u + 1e-7), 1e-5) << "step " << t;
  }
}

}  // namespace
}  // namespace core
}  // namespace sok_graph
