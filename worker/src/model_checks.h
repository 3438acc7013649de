// Test helpers shared by mlp_test and cnn_test: checks a model's zero-copy paths
// (BindParam, HostGradient, BindGradient) against its copying ones (SetParam, Gradient), and
// its chunked evaluation against a whole one. Single-threaded.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "leash/worker/model.h"

namespace leash::worker {

inline bool SameBits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// `copied` and `bound` are two models of the same architecture on the CPU. Trains both on
// the same batch, `copied` with SetParam and `bound` with BindParam of the same values,
// and expects bit-identical losses, predictions and gradients; then that `bound` reads
// the bound arrays in place (a change to them is seen by its next step) until SetParam
// makes it read its own copy again (a change then has no effect).
inline void ExpectBoundParamsTrainLikeCopiedOnes(Model& copied, Model& bound, int64_t batch,
                                                 uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t n = copied.params().size();
  std::vector<std::vector<float>> values;
  for (size_t i = 0; i < n; ++i) {
    const ParamSpec& p = copied.params()[i];
    const float scale = p.rows == 1 ? 0.2f : 1.f / std::sqrt(static_cast<float>(p.rows));
    std::uniform_real_distribution<float> dist(-scale, scale);
    values.emplace_back(p.size());
    for (float& v : values.back()) v = dist(rng);
    ASSERT_TRUE(copied.SetParam(i, values[i].data()).ok());
    ASSERT_TRUE(bound.BindParam(i, values[i].data()).ok());
  }
  std::uniform_real_distribution<float> pixel(0.f, 1.f);
  std::uniform_int_distribution<int32_t> label(0, static_cast<int32_t>(copied.num_classes() - 1));
  std::vector<float> images(static_cast<size_t>(batch * copied.input_size()));
  for (float& v : images) v = pixel(rng);
  std::vector<int32_t> labels(static_cast<size_t>(batch));
  for (int32_t& l : labels) l = label(rng);

  auto expect_same_step = [&](const char* what) {
    auto c = copied.TrainStep(images.data(), labels.data(), batch);
    // In on_grad the gradient just announced is readable in place; those of the layer
    // below (parameters 2 l - 2 and 2 l - 1 for layer l's 2 l and 2 l + 1) are not final
    // yet, as backward goes last layer first.
    auto b = bound.TrainStep(images.data(), labels.data(), batch, [&](size_t i) {
      Result<const float*> g = bound.HostGradient(i);
      ASSERT_TRUE(g.ok()) << g.status();
      EXPECT_NE(*g, nullptr);
      if (i >= 2) {
        EXPECT_EQ(bound.HostGradient(i / 2 * 2 - 2).status().code(),
                  StatusCode::kFailedPrecondition)
            << i;
      }
    });
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(std::memcmp(&b->loss, &c->loss, sizeof(float)), 0)
        << what << ": " << b->loss << " vs " << c->loss;
    EXPECT_EQ(b->correct, c->correct) << what;
    for (size_t i = 0; i < n; ++i) {
      std::vector<float> gc(values[i].size()), gb(values[i].size());
      ASSERT_TRUE(copied.Gradient(i, gc.data()).ok());
      ASSERT_TRUE(bound.Gradient(i, gb.data()).ok());
      EXPECT_TRUE(SameBits(gb.data(), gc.data(), gc.size())) << what << ": gradient " << i;
      Result<const float*> host = bound.HostGradient(i);
      ASSERT_TRUE(host.ok()) << host.status();
      ASSERT_NE(*host, nullptr);
      EXPECT_TRUE(SameBits(*host, gb.data(), gb.size())) << what << ": HostGradient " << i;
    }
    auto ec = copied.Evaluate(images.data(), labels.data(), batch);
    auto eb = bound.Evaluate(images.data(), labels.data(), batch);
    ASSERT_TRUE(ec.ok() && eb.ok());
    EXPECT_EQ(std::memcmp(&eb->loss, &ec->loss, sizeof(float)), 0) << what;
    EXPECT_EQ(eb->correct, ec->correct) << what;
  };
  expect_same_step("bound parameters");

  // The bound arrays are read in place: a change between steps reaches the next one.
  for (size_t i = 0; i < n; ++i) {
    for (float& v : values[i]) v *= 0.5f;
    ASSERT_TRUE(copied.SetParam(i, values[i].data()).ok());
  }
  expect_same_step("bound arrays changed between steps");

  // SetParam ends the binding: the model reads its own copy, whatever the array holds.
  for (size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(bound.SetParam(i, values[i].data()).ok());
    std::fill(values[i].begin(), values[i].end(), 7.f);
  }
  expect_same_step("SetParam after BindParam");

  std::vector<float> any(1);
  EXPECT_EQ(bound.BindParam(n, any.data()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bound.BindParam(0, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bound.HostGradient(n).status().code(), StatusCode::kInvalidArgument);
}

// `own` and `bound` are two models of the same architecture and parameters on the CPU.
// Trains both on the same batches, `bound` with every gradient bound to an array of ours
// (BindGradient) for its first step only, and expects: the arrays hold `own`'s gradients
// bit for bit, announced in place (HostGradient is the array in on_grad); the binding
// covers that one step (the second step writes `bound`'s own buffers and leaves the arrays
// as they were); and bad arguments are refused.
inline void ExpectBoundGradientsAreWrittenWhereBoundForOneStep(Model& own, Model& bound,
                                                               int64_t batch, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t n = own.params().size();
  std::uniform_real_distribution<float> pixel(0.f, 1.f);
  std::uniform_int_distribution<int32_t> label(0, static_cast<int32_t>(own.num_classes() - 1));
  std::vector<float> images(static_cast<size_t>(batch * own.input_size()));
  for (float& v : images) v = pixel(rng);
  std::vector<int32_t> labels(static_cast<size_t>(batch));
  for (int32_t& l : labels) l = label(rng);

  std::vector<std::vector<float>> arrays;
  for (size_t i = 0; i < n; ++i) {
    std::vector<float> values(own.params()[i].size());
    std::uniform_real_distribution<float> dist(-0.3f, 0.3f);
    for (float& v : values) v = dist(rng);
    ASSERT_TRUE(own.SetParam(i, values.data()).ok());
    ASSERT_TRUE(bound.SetParam(i, values.data()).ok());
    arrays.emplace_back(values.size(), -3.f);
    ASSERT_TRUE(bound.BindGradient(i, arrays[i].data()).ok()) << i;
  }
  std::vector<bool> announced(n, false);
  ASSERT_TRUE(own.TrainStep(images.data(), labels.data(), batch).ok());
  auto b = bound.TrainStep(images.data(), labels.data(), batch, [&](size_t i) {
    announced[i] = true;
    Result<const float*> g = bound.HostGradient(i);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(*g, arrays[i].data()) << "gradient " << i << " is not where it was bound";
  });
  ASSERT_TRUE(b.ok()) << b.status();
  for (size_t i = 0; i < n; ++i) {
    EXPECT_TRUE(announced[i]) << i;
    std::vector<float> want(arrays[i].size()), got(arrays[i].size());
    ASSERT_TRUE(own.Gradient(i, want.data()).ok());
    EXPECT_TRUE(SameBits(arrays[i].data(), want.data(), want.size())) << "bound gradient " << i;
    ASSERT_TRUE(bound.Gradient(i, got.data()).ok());
    EXPECT_TRUE(SameBits(got.data(), want.data(), want.size())) << "Gradient() of bound " << i;
  }

  // The binding covered one step: the next writes the model's own buffers, the arrays (the
  // caller's to send or reuse by now) keep the first step's gradients.
  std::vector<std::vector<float>> first = arrays;
  ASSERT_TRUE(own.TrainStep(images.data(), labels.data(), batch).ok());
  ASSERT_TRUE(bound.TrainStep(images.data(), labels.data(), batch).ok());
  for (size_t i = 0; i < n; ++i) {
    EXPECT_TRUE(SameBits(arrays[i].data(), first[i].data(), first[i].size()))
        << "the second step wrote gradient " << i << " into the array bound for the first";
    std::vector<float> want(arrays[i].size()), got(arrays[i].size());
    ASSERT_TRUE(own.Gradient(i, want.data()).ok());
    ASSERT_TRUE(bound.Gradient(i, got.data()).ok());
    EXPECT_TRUE(SameBits(got.data(), want.data(), want.size())) << "second step, gradient " << i;
    Result<const float*> host = bound.HostGradient(i);
    ASSERT_TRUE(host.ok()) << host.status();
    EXPECT_NE(*host, arrays[i].data()) << i;
  }

  std::vector<float> any(1);
  EXPECT_EQ(bound.BindGradient(n, any.data()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bound.BindGradient(0, nullptr).code(), StatusCode::kInvalidArgument);
}

// `small` and `large` are two models of the same architecture and parameters whose
// max_batch is below and at least `n`. Expects `small`'s Evaluate of the n examples (in
// chunks) to match `large`'s (at once) and a TrainStep of `large` on them to report the
// same loss, to `tolerance` relative to 1 + loss, and the same correct predictions.
inline void ExpectChunkedEvaluationMatchesWhole(Model& small, Model& large,
                                                const std::vector<float>& images,
                                                const std::vector<int32_t>& labels, int64_t n,
                                                double tolerance) {
  auto chunked = small.Evaluate(images.data(), labels.data(), n);
  auto whole = large.Evaluate(images.data(), labels.data(), n);
  ASSERT_TRUE(chunked.ok()) << chunked.status();
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_NEAR(chunked->loss, whole->loss, tolerance * (1 + whole->loss));
  EXPECT_EQ(chunked->correct, whole->correct);
  // A training step on the same examples reports the same numbers.
  auto step = large.TrainStep(images.data(), labels.data(), n);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_NEAR(step->loss, whole->loss, tolerance * (1 + whole->loss));
  EXPECT_EQ(step->correct, whole->correct);
}

// `model` (of max_batch `max_batch`, untrained) rejects with InvalidArgument: batches of
// 0, -1 and max_batch + 1 examples, null arrays, a label out of range (naming it and its
// example), evaluating 0 examples or null images, a parameter index out of range and null
// host arrays; it evaluates more examples than max_batch in chunks.
inline void ExpectBadArgumentsRejected(Model& model, int64_t max_batch) {
  const int64_t n = max_batch + 1;
  std::vector<float> images(static_cast<size_t>(n * model.input_size()), 0.1f);
  std::vector<int32_t> labels(static_cast<size_t>(n), 1);
  const auto train = [&](const float* x, const int32_t* y, int64_t batch) {
    return model.TrainStep(x, y, batch).status().code();
  };
  EXPECT_EQ(train(images.data(), labels.data(), 0), StatusCode::kInvalidArgument);
  EXPECT_EQ(train(images.data(), labels.data(), n), StatusCode::kInvalidArgument);
  EXPECT_EQ(train(images.data(), labels.data(), -1), StatusCode::kInvalidArgument);
  EXPECT_EQ(train(nullptr, labels.data(), 2), StatusCode::kInvalidArgument);
  EXPECT_EQ(train(images.data(), nullptr, 2), StatusCode::kInvalidArgument);
  const auto classes = static_cast<int32_t>(model.num_classes());
  labels[1] = classes;
  auto bad_label = model.TrainStep(images.data(), labels.data(), 2);
  EXPECT_EQ(bad_label.status().code(), StatusCode::kInvalidArgument);
  const std::string named = "label " + std::to_string(classes) + " of example 1";
  EXPECT_NE(bad_label.status().message().find(named), std::string::npos) << bad_label.status();
  labels[1] = 1;
  const auto evaluate = [&](const float* x, int64_t count) {
    return model.Evaluate(x, labels.data(), count).status().code();
  };
  EXPECT_EQ(evaluate(images.data(), 0), StatusCode::kInvalidArgument);
  EXPECT_EQ(evaluate(nullptr, n), StatusCode::kInvalidArgument);
  EXPECT_EQ(evaluate(images.data(), n), StatusCode::kOk);  // more than max_batch is fine

  const size_t count = model.params().size();
  size_t largest = 0;
  for (const ParamSpec& p : model.params()) largest = std::max(largest, p.size());
  std::vector<float> buf(largest);
  EXPECT_EQ(model.SetParam(count, buf.data()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(model.SetParam(0, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(model.Gradient(count, buf.data()).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(model.TrainStep(images.data(), labels.data(), 2).ok());
  EXPECT_EQ(model.Gradient(0, nullptr).code(), StatusCode::kInvalidArgument);
}

// A model that has not trained yet has no gradient to hand out in place.
inline void ExpectNoHostGradientBeforeTraining(Model& fresh) {
  for (size_t i = 0; i < fresh.params().size(); ++i) {
    EXPECT_EQ(fresh.HostGradient(i).status().code(), StatusCode::kFailedPrecondition) << i;
  }
}

}  // namespace leash::worker
