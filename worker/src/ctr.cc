// The click-through model: per-field embedding bags (rows pulled from a sparse table),
// concatenated, through dense layers with ReLU to one logit, logistic loss; the dense
// products through kernels::Gemm on the CPU. Every buffer is sized once for max_batch
// examples, except those that follow a batch's distinct keys. One thread at a time.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "leash/kernels/kernels.h"
#include "leash/worker/model.h"

#include "batch_stager.h"

namespace leash::worker {
namespace {

using kernels::Context;
using kernels::Transpose;

constexpr uint64_t kInitSeed = 0x1ea5'0c72;

// Area under the ROC curve of scores against 0/1 labels (ties count one half): the
// Mann-Whitney statistic over ranks. -1 when one class is absent.
double Auc(const std::vector<float>& score, const int32_t* labels, int64_t n) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return score[static_cast<size_t>(a)] < score[static_cast<size_t>(b)];
  });
  double rank_sum = 0;
  int64_t pos = 0;
  for (int64_t i = 0; i < n;) {
    int64_t j = i;
    while (j < n && score[static_cast<size_t>(order[static_cast<size_t>(j)])] ==
                        score[static_cast<size_t>(order[static_cast<size_t>(i)])])
      ++j;
    double mid = (static_cast<double>(i) + static_cast<double>(j - 1)) / 2.0 + 1.0;
    for (int64_t k = i; k < j; ++k) {
      if (labels[order[static_cast<size_t>(k)]] == 1) {
        rank_sum += mid;
        ++pos;
      }
    }
    i = j;
  }
  const int64_t neg = n - pos;
  if (pos == 0 || neg == 0) return -1;
  return (rank_sum - static_cast<double>(pos) * static_cast<double>(pos + 1) / 2.0) /
         (static_cast<double>(pos) * static_cast<double>(neg));
}

class Ctr final : public Model {
 public:
  Ctr(Context& ctx, std::vector<int> slot_fields, int64_t dim, int64_t max_batch)
      : ctx_(ctx), slot_fields_(std::move(slot_fields)), dim_(dim), max_batch_(max_batch) {
    fields_ = slot_fields_.back() + 1;
  }

  Status Init(const std::vector<int64_t>& hidden, float embedding_scale) {
    std::mt19937_64 rng(kInitSeed);
    std::vector<int64_t> widths = {fields_ * dim_};
    widths.insert(widths.end(), hidden.begin(), hidden.end());
    widths.push_back(1);
    size_t widest = 0;
    for (size_t l = 0; l + 1 < widths.size(); ++l) {
      Layer layer;
      layer.in = widths[l];
      layer.out = widths[l + 1];
      widest = std::max(widest, static_cast<size_t>(std::max(layer.in, layer.out)));
      const std::string name = "ctr/fc" + std::to_string(l + 1);
      const float stddev = std::sqrt(2.f / static_cast<float>(layer.in));
      params_.push_back({name + "/w", static_cast<uint64_t>(layer.in),
                         static_cast<uint32_t>(layer.out), InitKind::kNormal, stddev});
      params_.push_back({name + "/b", 1, static_cast<uint32_t>(layer.out), InitKind::kZeros, 0.f});
      std::normal_distribution<float> normal(0.f, stddev);
      std::vector<float> w(static_cast<size_t>(layer.in * layer.out));
      for (float& v : w) v = normal(rng);
      own_.push_back(std::move(w));
      own_.emplace_back(static_cast<size_t>(layer.out), 0.f);
      layer.act.resize(static_cast<size_t>(max_batch_ * layer.out));
      layers_.push_back(std::move(layer));
    }
    for (const auto& v : own_) {
      grads_.emplace_back(v.size());
      read_.push_back(v.data());
    }
    ready_.assign(params_.size(), false);
    sparse_ = {"ctr/embedding", 0, static_cast<uint32_t>(dim_), InitKind::kUniform,
               embedding_scale};
    x_.resize(static_cast<size_t>(max_batch_ * fields_ * dim_));
    delta_[0].resize(static_cast<size_t>(max_batch_) * widest);
    delta_[1].resize(static_cast<size_t>(max_batch_) * widest);
    return Status::Ok();
  }

  const std::vector<ParamSpec>& params() const override { return params_; }
  int64_t input_size() const override { return 0; }
  int64_t num_classes() const override { return 2; }
  const ParamSpec* sparse_param() const override { return &sparse_; }

  Status SetParam(size_t index, const float* host) override {
    LEASH_RETURN_IF_ERROR(CheckParamIndex("SetParam", index, params_.size()));
    if (host == nullptr) return InvalidArgument("SetParam: null data for " + params_[index].name);
    std::memcpy(own_[index].data(), host, own_[index].size() * sizeof(float));
    read_[index] = own_[index].data();
    return Status::Ok();
  }

  Status BindParam(size_t index, const float* host) override {
    LEASH_RETURN_IF_ERROR(CheckParamIndex("BindParam", index, params_.size()));
    if (host == nullptr) return InvalidArgument("BindParam: null data for " + params_[index].name);
    read_[index] = host;
    return Status::Ok();
  }

  Result<std::span<const uint64_t>> SparseKeys(const uint64_t* keys, int64_t n,
                                               int64_t key_slots) override {
    if (key_slots != static_cast<int64_t>(slot_fields_.size())) {
      return InvalidArgument("SparseKeys: the data has " + std::to_string(key_slots) +
                             " key slots per example, the model expects " +
                             std::to_string(slot_fields_.size()));
    }
    if (n < 0 || (n > 0 && keys == nullptr)) return InvalidArgument("SparseKeys: no keys");
    uniq_.clear();
    index_.clear();
    slot_row_.resize(static_cast<size_t>(n * key_slots));
    for (int64_t i = 0; i < n * key_slots; ++i) {
      const uint64_t k = keys[i];
      if (k == 0) {
        slot_row_[static_cast<size_t>(i)] = -1;
        continue;
      }
      auto [it, fresh] = index_.try_emplace(k, static_cast<int32_t>(uniq_.size()));
      if (fresh) uniq_.push_back(k);
      slot_row_[static_cast<size_t>(i)] = it->second;
    }
    examples_ = n;
    rows_ = nullptr;
    return std::span<const uint64_t>(uniq_);
  }

  Status SetSparseRows(const float* rows) override {
    if (rows == nullptr && !uniq_.empty()) return InvalidArgument("SetSparseRows: null rows");
    rows_ = rows;
    return Status::Ok();
  }

  Result<const float*> SparseGradient() override {
    if (!trained_) return FailedPrecondition("SparseGradient: no TrainStep since the keys");
    return static_cast<const float*>(sgrad_.data());
  }

  Result<StepStats> TrainStep(const float*, const int32_t* labels, int64_t batch,
                              const std::function<void(size_t)>& on_grad) override {
    LEASH_RETURN_IF_ERROR(CheckBatch("TrainStep", labels, batch));
    trained_ = false;
    LEASH_ASSIGN_OR_RETURN(const float* z, Forward(0, batch));
    StepStats stats;
    double loss = 0;
    std::vector<float>& dz = delta_[0];
    const float inv = 1.f / static_cast<float>(batch);
    for (int64_t i = 0; i < batch; ++i) {
      const float y = static_cast<float>(labels[i]);
      const float p = 1.f / (1.f + std::exp(-z[i]));
      loss += Softplus(z[i]) - static_cast<double>(y) * z[i];
      stats.correct += (p >= 0.5f) == (labels[i] == 1);
      dz[static_cast<size_t>(i)] = (p - y) * inv;
    }
    stats.loss = static_cast<float>(loss / static_cast<double>(batch));
    LEASH_RETURN_IF_ERROR(Backward(batch, on_grad));
    trained_ = true;
    return stats;
  }

  // Nothing to stage: the rows come with the step's pull.
  Status PrefetchBatch(const float*, const int32_t* labels, int64_t batch) override {
    if (batch < 1 || batch > max_batch_ || labels == nullptr)
      return InvalidArgument("PrefetchBatch: bad batch");
    return Status::Ok();
  }
  StagingStats staging() const override { return {}; }

  Status Gradient(size_t index, float* out) override {
    LEASH_ASSIGN_OR_RETURN(const float* g, HostGradient(index));
    std::memcpy(out, g, grads_[index].size() * sizeof(float));
    return Status::Ok();
  }

  Result<const float*> HostGradient(size_t index) override {
    LEASH_RETURN_IF_ERROR(CheckParamIndex("HostGradient", index, params_.size()));
    if (!trained_ && !ready_[index])
      return FailedPrecondition("HostGradient: the gradient of " + params_[index].name +
                                " is not final yet");
    return static_cast<const float*>(grads_[index].data());
  }

  Result<StepStats> Evaluate(const float*, const int32_t* labels, int64_t n) override {
    LEASH_RETURN_IF_ERROR(CheckBatch("Evaluate", labels, n));
    trained_ = false;
    std::vector<float> scores(static_cast<size_t>(n));
    StepStats stats;
    double loss = 0;
    for (int64_t begin = 0; begin < n; begin += max_batch_) {
      const int64_t rows = std::min(max_batch_, n - begin);
      LEASH_ASSIGN_OR_RETURN(const float* z, Forward(begin, rows));
      for (int64_t i = 0; i < rows; ++i) {
        const int32_t label = labels[begin + i];
        scores[static_cast<size_t>(begin + i)] = z[i];
        loss += Softplus(z[i]) - (label == 1 ? static_cast<double>(z[i]) : 0.0);
        stats.correct += (z[i] >= 0.f) == (label == 1);
      }
    }
    stats.loss = n > 0 ? static_cast<float>(loss / static_cast<double>(n)) : 0.f;
    stats.auc = Auc(scores, labels, n);
    return stats;
  }

 private:
  struct Layer {
    int64_t in = 0;
    int64_t out = 0;
    std::vector<float> act;  // output for the batch (after ReLU, except the last)
  };

  static double Softplus(float z) {
    return z > 0 ? z + std::log1p(std::exp(-static_cast<double>(z)))
                 : std::log1p(std::exp(static_cast<double>(z)));
  }

  // Checks a step over the `n` examples whose keys SparseKeys was given.
  Status CheckBatch(const char* op, const int32_t* labels, int64_t n) {
    if (n != examples_) {
      return InvalidArgument(std::string(op) + ": " + std::to_string(n) +
                             " examples, but SparseKeys was given " + std::to_string(examples_));
    }
    if (n > 0 && labels == nullptr) return InvalidArgument(std::string(op) + ": null labels");
    if (std::string_view(op) == "TrainStep" && (n < 1 || n > max_batch_)) {
      return InvalidArgument(std::string(op) + ": batch must be in [1, " +
                             std::to_string(max_batch_) + "], got " + std::to_string(n));
    }
    if (rows_ == nullptr && !uniq_.empty())
      return FailedPrecondition(std::string(op) + ": SetSparseRows was not called for the keys");
    return Status::Ok();
  }

  // Logits of examples [begin, begin + n) into the last layer's act.
  Result<const float*> Forward(int64_t begin, int64_t n) {
    const size_t slots = slot_fields_.size();
    const size_t width = static_cast<size_t>(fields_ * dim_);
    std::fill(x_.begin(), x_.begin() + static_cast<ptrdiff_t>(n * fields_ * dim_), 0.f);
    for (int64_t e = 0; e < n; ++e) {
      const int32_t* row = slot_row_.data() + static_cast<size_t>(begin + e) * slots;
      float* x = x_.data() + static_cast<size_t>(e) * width;
      size_t s = 0;
      while (s < slots) {
        const int f = slot_fields_[s];
        float* out = x + static_cast<size_t>(f) * static_cast<size_t>(dim_);
        int count = 0;
        for (; s < slots && slot_fields_[s] == f; ++s) {
          if (row[s] < 0) continue;
          const float* v = rows_ + static_cast<size_t>(row[s]) * static_cast<size_t>(dim_);
          for (int64_t d = 0; d < dim_; ++d) out[d] += v[d];
          ++count;
        }
        if (count > 1) {
          const float inv = 1.f / static_cast<float>(count);
          for (int64_t d = 0; d < dim_; ++d) out[d] *= inv;
        }
      }
    }
    const float* in = x_.data();
    for (size_t l = 0; l < layers_.size(); ++l) {
      Layer& layer = layers_[l];
      LEASH_RETURN_IF_ERROR(kernels::Gemm(ctx_, Transpose::kNo, Transpose::kNo, n, layer.out,
                                          layer.in, 1.f, in, read_[2 * l], 0.f, layer.act.data()));
      LEASH_RETURN_IF_ERROR(
          kernels::BiasAdd(ctx_, n, layer.out, read_[2 * l + 1], layer.act.data()));
      if (l + 1 < layers_.size())
        LEASH_RETURN_IF_ERROR(
            kernels::Relu(ctx_, n * layer.out, layer.act.data(), layer.act.data()));
      in = layer.act.data();
    }
    return in;
  }

  // From dz (delta_[0], batch x 1) to every dense gradient and the rows' gradients.
  Status Backward(int64_t batch, const std::function<void(size_t)>& on_grad) {
    std::fill(ready_.begin(), ready_.end(), false);
    std::vector<float>* dz = &delta_[0];
    std::vector<float>* dnext = &delta_[1];
    for (size_t l = layers_.size(); l-- > 0;) {
      Layer& layer = layers_[l];
      const float* x = l == 0 ? x_.data() : layers_[l - 1].act.data();
      LEASH_RETURN_IF_ERROR(kernels::Gemm(ctx_, Transpose::kYes, Transpose::kNo, layer.in,
                                          layer.out, batch, 1.f, x, dz->data(), 0.f,
                                          grads_[2 * l].data()));
      LEASH_RETURN_IF_ERROR(
          kernels::BiasGrad(ctx_, batch, layer.out, dz->data(), grads_[2 * l + 1].data()));
      ready_[2 * l] = ready_[2 * l + 1] = true;
      if (on_grad) {
        on_grad(2 * l + 1);
        on_grad(2 * l);
      }
      // dx = dz W^T; through the ReLU below, except for the embeddings.
      LEASH_RETURN_IF_ERROR(kernels::Gemm(ctx_, Transpose::kNo, Transpose::kYes, batch, layer.in,
                                          layer.out, 1.f, dz->data(), read_[2 * l], 0.f,
                                          dnext->data()));
      if (l > 0) {
        LEASH_RETURN_IF_ERROR(
            kernels::ReluBackward(ctx_, batch * layer.in, x, dnext->data(), dnext->data()));
      }
      std::swap(dz, dnext);
    }
    // dz holds d loss / d x (batch x fields*dim): each field's share goes to its rows.
    sgrad_.assign(uniq_.size() * static_cast<size_t>(dim_), 0.f);
    const size_t slots = slot_fields_.size();
    const size_t width = static_cast<size_t>(fields_ * dim_);
    for (int64_t e = 0; e < batch; ++e) {
      const int32_t* row = slot_row_.data() + static_cast<size_t>(e) * slots;
      const float* dx = dz->data() + static_cast<size_t>(e) * width;
      size_t s = 0;
      while (s < slots) {
        const int f = slot_fields_[s];
        const size_t first = s;
        int count = 0;
        for (; s < slots && slot_fields_[s] == f; ++s) count += row[s] >= 0;
        if (count == 0) continue;
        const float scale = 1.f / static_cast<float>(count);
        const float* g = dx + static_cast<size_t>(f) * static_cast<size_t>(dim_);
        for (size_t t = first; t < s; ++t) {
          if (row[t] < 0) continue;
          float* out = sgrad_.data() + static_cast<size_t>(row[t]) * static_cast<size_t>(dim_);
          for (int64_t d = 0; d < dim_; ++d) out[d] += g[d] * scale;
        }
      }
    }
    return Status::Ok();
  }

  Context& ctx_;
  std::vector<int> slot_fields_;
  int64_t fields_ = 0;
  int64_t dim_;
  int64_t max_batch_;
  std::vector<ParamSpec> params_;
  ParamSpec sparse_;
  std::vector<std::vector<float>> own_;    // parameter values when not bound
  std::vector<const float*> read_;         // where each parameter is read: own_ or bound
  std::vector<std::vector<float>> grads_;  // dense gradients of the last TrainStep
  std::vector<bool> ready_;                // gradients final during the current TrainStep
  bool trained_ = false;
  std::vector<Layer> layers_;
  std::vector<float> x_;         // the concatenated embeddings, max_batch x fields x dim
  std::vector<float> delta_[2];  // the gradient flowing back
  // The keys of the current examples: distinct keys, their index, each slot's row (-1:
  // empty), and the pulled rows (not owned).
  std::vector<uint64_t> uniq_;
  std::unordered_map<uint64_t, int32_t> index_;
  std::vector<int32_t> slot_row_;
  int64_t examples_ = 0;
  const float* rows_ = nullptr;
  std::vector<float> sgrad_;  // gradient by each row of uniq_
};

}  // namespace

Result<std::unique_ptr<Model>> MakeCtr(kernels::Context& ctx, std::vector<int> slot_fields,
                                       int64_t embedding_dim, std::vector<int64_t> hidden,
                                       int64_t max_batch, float embedding_scale) {
  if (ctx.device().type != kernels::DeviceType::kCpu)
    return InvalidArgument("MakeCtr: the click-through model runs on the CPU; use --device cpu");
  if (slot_fields.empty() || slot_fields.front() != 0)
    return InvalidArgument("MakeCtr: slot_fields must be non-empty and start at field 0");
  for (size_t i = 1; i < slot_fields.size(); ++i) {
    if (slot_fields[i] != slot_fields[i - 1] && slot_fields[i] != slot_fields[i - 1] + 1)
      return InvalidArgument("MakeCtr: slot_fields must number the fields 0, 1, ... in order");
  }
  if (embedding_dim < 1 || embedding_dim > 4096)
    return InvalidArgument("MakeCtr: embedding_dim must be in [1, 4096], got " +
                           std::to_string(embedding_dim));
  if (hidden.empty() || hidden.size() > 30)
    return InvalidArgument("MakeCtr: needs 1 to 30 hidden layer sizes, e.g. {64}");
  for (int64_t h : hidden) {
    if (h < 1 || h > (1 << 20))
      return InvalidArgument("MakeCtr: hidden sizes must be in [1, 2^20], got " +
                             std::to_string(h));
  }
  if (max_batch < 1 || max_batch > (1 << 20))
    return InvalidArgument("MakeCtr: max_batch must be in [1, 2^20], got " +
                           std::to_string(max_batch));
  if (!(embedding_scale >= 0) || !std::isfinite(embedding_scale))
    return InvalidArgument("MakeCtr: embedding_scale must be finite and >= 0");
  auto model = std::make_unique<Ctr>(ctx, std::move(slot_fields), embedding_dim, max_batch);
  LEASH_RETURN_IF_ERROR(model->Init(hidden, embedding_scale));
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace leash::worker
