// Built-in models a worker trains: parameters as named dense tables, a training step
// that produces per-parameter gradients, and evaluation. Parameters and gradients cross
// this interface as host float arrays; inside, a model computes on its kernels::Context
// (CPU or CUDA). One thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "leash/common/domain.h"
#include "leash/common/status.h"
#include "leash/kernels/kernels.h"

namespace leash::worker {

// How a parameter table is initialized (the domain's initializer kinds).
using InitKind = ::leash::InitKind;

struct ParamSpec {
  std::string name;   // table name, e.g. "mlp/fc1/w"
  uint64_t rows = 0;  // fc weight: in_features rows of out_features cols (y = x W + b)
  uint32_t cols = 0;
  InitKind init = InitKind::kZeros;
  float init_scale = 0.f;  // Uniform: bound; Normal: stddev; Constant: value
  size_t size() const { return static_cast<size_t>(rows) * cols; }
};

struct StepStats {
  float loss = 0.f;     // mean loss of the batch
  int64_t correct = 0;  // examples whose prediction was right
  double auc = -1;      // Evaluate of a binary model: area under the ROC curve; else -1
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const std::vector<ParamSpec>& params() const = 0;
  // Number of input features per example and of classes.
  virtual int64_t input_size() const = 0;
  virtual int64_t num_classes() const = 0;

  // Sets parameter `index` from `size()` host floats, copied into the model's own storage
  // before returning. Ends a BindParam of that index. InvalidArgument for a bad index or a
  // null `host`.
  virtual Status SetParam(size_t index, const float* host) = 0;

  // Makes the model read parameter `index` straight from `host` (size() floats) instead of
  // copying it, until the next SetParam or BindParam of that index. The caller keeps the
  // array alive, at the same address, and unchanged during every TrainStep and Evaluate
  // that runs while it is bound (writing it between them is allowed: the next step reads
  // the new values). InvalidArgument for a bad index or a null `host`; FailedPrecondition
  // when the model's device cannot read host memory (a GPU): nothing is bound then and the
  // caller uses SetParam. The default implementation binds nothing.
  virtual Status BindParam(size_t index, const float* host);

  // Forward and backward on a batch of `batch` examples (host images batch x
  // input_size(), labels in [0, num_classes())). `on_grad(index)` is called as soon as the
  // gradient of parameter `index` is final (backward order, last layer first), so the
  // caller can push it while backward goes on; it may call Gradient(index). Gradients are
  // of the batch's mean loss.
  virtual Result<StepStats> TrainStep(const float* images_host, const int32_t* labels_host,
                                      int64_t batch,
                                      const std::function<void(size_t)>& on_grad = nullptr) = 0;
  // Starts moving the batch the next TrainStep will train to the model's device (on a GPU:
  // from pinned memory on a copy stream, into the buffer the step in progress is not
  // reading), so the copy overlaps the computation in between. The next TrainStep called
  // with the same arrays and batch size trains the copy made here; the arrays must stay
  // unchanged until then. A TrainStep or Evaluate on other arrays discards it. Validates
  // like TrainStep (InvalidArgument).
  virtual Status PrefetchBatch(const float* images_host, const int32_t* labels_host,
                               int64_t batch) = 0;
  // Batches passed to PrefetchBatch, and how many of them a TrainStep took.
  struct StagingStats {
    int64_t prefetched = 0;
    int64_t used = 0;
  };
  virtual StagingStats staging() const = 0;

  // Copies the gradient of parameter `index` from the last TrainStep into `out_host`.
  virtual Status Gradient(size_t index, float* out_host) = 0;

  // The gradient of parameter `index` from the last TrainStep where the model keeps it in
  // host memory, to read without a copy: size() floats, valid and unchanged until the next
  // TrainStep or Evaluate. nullptr when the model's gradients are not in host memory (a
  // GPU): the caller uses Gradient() then. Errors as Gradient(): InvalidArgument for a bad
  // index, FailedPrecondition before the gradient is final (see TrainStep's on_grad). The
  // default implementation checks only the index and returns nullptr.
  virtual Result<const float*> HostGradient(size_t index);

  // Makes the next TrainStep write the gradient of parameter `index` into `host` (size()
  // floats) instead of the model's own buffer, so the caller can send it from there
  // without a copy. The binding covers that one step: the step after it writes into the
  // model's own buffer again unless bound anew, so an array handed on after its step is
  // never written by the model again. After the bound step, Gradient and HostGradient read
  // `host` (the caller keeps it alive while it calls them). InvalidArgument for a bad index
  // or a null `host`; FailedPrecondition where the model's kernels cannot write host memory
  // (a GPU) or the model always writes its own buffers (the default implementation):
  // nothing is bound then, and the caller copies with Gradient or reads HostGradient.
  virtual Status BindGradient(size_t index, float* host);

  // Loss and correct predictions over `n` examples (evaluated in chunks).
  virtual Result<StepStats> Evaluate(const float* images_host, const int32_t* labels_host,
                                     int64_t n) = 0;

  // Models with embeddings in a sparse table (the click-through model) read categorical
  // keys (Dataset::keys) instead of images (input_size() is 0; images_host may be null).
  // sparse_param() is the embedding table (rows 0, cols the embedding dimension); nullptr
  // for a dense model, which needs none of the three calls below.
  virtual const ParamSpec* sparse_param() const { return nullptr; }
  // Before each TrainStep or Evaluate of `n` examples: their keys (n x key_slots, 0 for an
  // empty slot). Returns the distinct keys whose rows the step reads, in first-seen order
  // (example by example, slot by slot; 0 skipped), so a caller can compute the same list
  // ahead of time; valid until the next call. InvalidArgument for bad sizes;
  // FailedPrecondition for a dense model.
  virtual Result<std::span<const uint64_t>> SparseKeys(const uint64_t* keys, int64_t n,
                                                       int64_t key_slots);
  // The rows of SparseKeys' keys, in that order (keys x cols floats), read in place by the
  // next TrainStep or Evaluate: the caller keeps them alive and unchanged until then.
  virtual Status SetSparseRows(const float* rows);
  // After a TrainStep: the gradient of the batch's mean loss by each row of SparseKeys'
  // keys (keys x cols floats, host memory), valid until the next step.
  virtual Result<const float*> SparseGradient();
};

// The multilayer perceptron: input -> hidden[0] -> ... -> classes, ReLU between layers,
// softmax cross-entropy. Weights He-initialized (normal, stddev sqrt(2 / fan_in)), biases
// zero. InvalidArgument for empty or non-positive sizes.
Result<std::unique_ptr<Model>> MakeMlp(kernels::Context& ctx, int64_t input_size,
                                       std::vector<int64_t> hidden, int64_t num_classes,
                                       int64_t max_batch);

// The convolutional network for 1 x 28 x 28 images (row-major, input_size() 784) and 10
// classes, as for Fashion-MNIST: conv 3x3 with 32 channels and padding 1, ReLU, 2x2 max
// pooling (32 x 14 x 14), conv 3x3 with 64 channels and padding 1, ReLU, 2x2 max pooling
// (64 x 7 x 7), dense 3136 -> 128, ReLU, dense 128 -> 10, softmax cross-entropy. Its
// parameters, in order: "cnn/conv1/w" (32 x 9: c_out rows of c_in x 3 x 3), "cnn/conv1/b"
// (1 x 32), "cnn/conv2/w" (64 x 288), "cnn/conv2/b" (1 x 64), "cnn/fc1/w" (3136 x 128, in x
// out as for the MLP, rows in channel, row, column order of the pooled features),
// "cnn/fc1/b", "cnn/fc2/w" (128 x 10), "cnn/fc2/b". Weights He-initialized (normal, stddev
// sqrt(2 / fan_in), fan_in = c_in x 3 x 3 for a convolution), biases zero.
// InvalidArgument for max_batch outside [1, 85598] (conv1's output must stay within the
// kernels' 2^31 - 1 elements per tensor); ResourceExhausted when the buffers do not fit.
Result<std::unique_ptr<Model>> MakeCnn(kernels::Context& ctx, int64_t max_batch);

// The click-through model (embeddings + MLP, docs/models.md): each example's key slots
// belong to fields (`slot_fields[s]`, 0-based and non-decreasing, e.g.
// MovieLensSlotFields()); a field's embedding is the mean of the rows of its non-empty
// slots (an embedding bag), the fields' embeddings are concatenated (fields x dim) and go
// through dense layers `hidden` with ReLU to one logit, trained with the logistic loss.
// Parameters: "ctr/fc<i>/w" (in x out), "ctr/fc<i>/b", the last layer's out being 1; the
// embedding table "ctr/embedding" (sparse_param(), uniform in +-embedding_scale). Weights
// He-initialized, biases zero. Runs on the CPU (its own BLAS calls; `ctx` must be a CPU
// context). InvalidArgument for empty or non-positive sizes or a CUDA context.
Result<std::unique_ptr<Model>> MakeCtr(kernels::Context& ctx, std::vector<int> slot_fields,
                                       int64_t embedding_dim, std::vector<int64_t> hidden,
                                       int64_t max_batch, float embedding_scale = 0.05f);

}  // namespace leash::worker
