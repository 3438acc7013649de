// Tests of the click-through model: key deduplication, and its dense and embedding
// gradients against central finite differences of its loss.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "leash/kernels/kernels.h"
#include "leash/worker/model.h"

namespace leash::worker {
namespace {

class CtrTest : public testing::Test {
 protected:
  void SetUp() override {
    auto ctx = kernels::Context::Create(kernels::Device{});
    ASSERT_TRUE(ctx.ok());
    ctx_ = std::move(*ctx);
    // Field 0 has one slot, field 1 is a bag of two.
    auto m = MakeCtr(*ctx_, {0, 1, 1}, kDim, {5, 4}, 8);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = std::move(*m);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.f, 0.5f);
    for (const ParamSpec& p : model_->params()) {
      values_.emplace_back(p.size());
      for (float& v : values_.back()) v = normal(rng);
    }
    for (size_t i = 0; i < values_.size(); ++i)
      ASSERT_TRUE(model_->SetParam(i, values_[i].data()).ok());
  }

  // The mean loss of the examples with the current rows_ and values_.
  double Loss() {
    for (size_t i = 0; i < values_.size(); ++i)
      EXPECT_TRUE(model_->SetParam(i, values_[i].data()).ok());
    auto keys = model_->SparseKeys(keys_.data(), kExamples, 3);
    EXPECT_TRUE(keys.ok());
    EXPECT_TRUE(model_->SetSparseRows(rows_.data()).ok());
    auto st = model_->Evaluate(nullptr, labels_.data(), kExamples);
    EXPECT_TRUE(st.ok());
    return st->loss;
  }

  static constexpr int64_t kDim = 3;
  static constexpr int64_t kExamples = 4;
  std::unique_ptr<kernels::Context> ctx_;
  std::unique_ptr<Model> model_;
  std::vector<std::vector<float>> values_;
  // Key 11 is in two examples, key 22 twice in one bag and once in another; 0 is empty.
  std::vector<uint64_t> keys_ = {11, 22, 33, 11, 22, 0, 44, 22, 22, 55, 0, 0};
  std::vector<int32_t> labels_ = {1, 0, 1, 0};
  std::vector<float> rows_;
};

TEST_F(CtrTest, SparseKeysAreTheDistinctNonEmptyKeysInFirstSeenOrder) {
  auto keys = model_->SparseKeys(keys_.data(), kExamples, 3);
  ASSERT_TRUE(keys.ok());
  EXPECT_EQ(std::vector<uint64_t>(keys->begin(), keys->end()),
            (std::vector<uint64_t>{11, 22, 33, 44, 55}));
  EXPECT_EQ(model_->sparse_param()->cols, kDim);
  EXPECT_EQ(model_->SparseKeys(keys_.data(), kExamples, 4).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(CtrTest, GradientsMatchFiniteDifferencesOfTheLoss) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 0.5f);
  rows_.resize(5 * kDim);
  for (float& v : rows_) v = normal(rng);

  auto keys = model_->SparseKeys(keys_.data(), kExamples, 3);
  ASSERT_TRUE(keys.ok());
  ASSERT_TRUE(model_->SetSparseRows(rows_.data()).ok());
  auto step = model_->TrainStep(nullptr, labels_.data(), kExamples, nullptr);
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  std::vector<std::vector<float>> grads;
  for (size_t i = 0; i < values_.size(); ++i) {
    grads.emplace_back(values_[i].size());
    ASSERT_TRUE(model_->Gradient(i, grads.back().data()).ok());
  }
  auto sg = model_->SparseGradient();
  ASSERT_TRUE(sg.ok());
  std::vector<float> sparse_grad(*sg, *sg + rows_.size());
  EXPECT_NEAR(Loss(), step->loss, 1e-5);

  const float eps = 1e-2f;
  auto check = [&](float* v, float analytic, const std::string& what) {
    const float keep = *v;
    *v = keep + eps;
    const double up = Loss();
    *v = keep - eps;
    const double down = Loss();
    *v = keep;
    const double numeric = (up - down) / (2 * eps);
    EXPECT_NEAR(analytic, numeric, 2e-3 + 1e-2 * std::abs(numeric)) << what;
  };
  for (size_t i = 0; i < values_.size(); ++i)
    for (size_t j = 0; j < values_[i].size(); ++j)
      check(&values_[i][j], grads[i][j], model_->params()[i].name + "[" + std::to_string(j) + "]");
  for (size_t j = 0; j < rows_.size(); ++j)
    check(&rows_[j], sparse_grad[j],
          "row " + std::to_string(j / kDim) + "[" + std::to_string(j % kDim) + "]");
}

TEST(CtrModelTest, RejectsBadSizesAndCudaContexts) {
  auto ctx = kernels::Context::Create(kernels::Device{});
  ASSERT_TRUE(ctx.ok());
  EXPECT_EQ(MakeCtr(**ctx, {}, 4, {8}, 8).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeCtr(**ctx, {0, 2}, 4, {8}, 8).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeCtr(**ctx, {0}, 0, {8}, 8).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeCtr(**ctx, {0}, 4, {}, 8).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace leash::worker
