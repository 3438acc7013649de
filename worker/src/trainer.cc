// Training loop and result reporting.
#include "leash/worker/trainer.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <fstream>

namespace leash::worker {
namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

Result<StepStats> EvaluateAll(Model& model, ParamStore& params, std::vector<std::vector<float>>* values,
                              const Dataset& test) {
  LEASH_RETURN_IF_ERROR(params.PullAll(values));
  for (size_t i = 0; i < values->size(); ++i) LEASH_RETURN_IF_ERROR(model.SetParam(i, (*values)[i].data()));
  return model.Evaluate(test.images.data(), test.labels.data(), test.count);
}

}  // namespace

Result<std::vector<EpochResult>> Train(Model& model, ParamStore& params, const Dataset& train, const Dataset* test,
                                       const TrainOptions& o, const std::atomic<bool>* stop) {
  if (o.epochs < 1 || o.batch < 1 || o.num_workers < 1 || o.worker_index < 0 || o.worker_index >= o.num_workers) {
    return InvalidArgument("need epochs >= 1, batch >= 1 and 0 <= worker index < num workers");
  }
  if (train.features() != model.input_size()) {
    return InvalidArgument("dataset has " + std::to_string(train.features()) + " features per sample, the model expects " +
                           std::to_string(model.input_size()));
  }
  std::vector<int64_t> indices;
  for (int64_t i = o.worker_index; i < train.count; i += o.num_workers) indices.push_back(i);

  const auto& specs = model.params();
  std::vector<std::vector<float>> values;
  std::vector<std::vector<float>> grads(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) grads[i].resize(specs[i].size());

  std::vector<EpochResult> results;
  auto t_start = std::chrono::steady_clock::now();
  LoaderOptions lo;
  lo.batch_size = o.batch;
  lo.seed = o.seed * 7919 + static_cast<uint64_t>(o.worker_index);
  for (int64_t epoch = 0; epoch < o.epochs; ++epoch) {
    BatchLoader loader(train, indices, lo, epoch);
    EpochResult r;
    r.epoch = epoch + 1;
    double loss_sum = 0;
    int64_t correct = 0;
    double window_loss = 0;
    int64_t window_samples = 0;
    int64_t window_correct = 0;
    auto t_epoch = std::chrono::steady_clock::now();
    auto t_window = t_epoch;
    while (auto batch = loader.Next()) {
      if (stop != nullptr && stop->load()) break;
      LEASH_RETURN_IF_ERROR(params.PullAll(&values));
      for (size_t i = 0; i < values.size(); ++i) LEASH_RETURN_IF_ERROR(model.SetParam(i, values[i].data()));
      Status grad_status;
      auto st = model.TrainStep(batch->images.data(), batch->labels.data(), batch->size, [&](size_t i) {
        Status g = model.Gradient(i, grads[i].data());
        if (!g.ok()) {
          if (grad_status.ok()) grad_status = g;
          return;
        }
        params.Push(i, grads[i].data());
      });
      if (!st.ok()) return st.status();
      LEASH_RETURN_IF_ERROR(grad_status);
      LEASH_RETURN_IF_ERROR(params.EndIteration());
      ++r.steps;
      r.samples += batch->size;
      loss_sum += static_cast<double>(st->loss) * static_cast<double>(batch->size);
      correct += st->correct;
      window_loss += static_cast<double>(st->loss) * static_cast<double>(batch->size);
      window_samples += batch->size;
      window_correct += st->correct;
      if (o.log_every > 0 && r.steps % o.log_every == 0) {
        auto now = std::chrono::steady_clock::now();
        double sps = static_cast<double>(window_samples) / std::max(1e-9, Seconds(t_window, now));
        std::printf("%s epoch %lld/%lld step %lld/%lld clock %lld loss %.4f acc %.3f %.0f samples/s\n", o.label.c_str(),
                    static_cast<long long>(epoch + 1), static_cast<long long>(o.epochs), static_cast<long long>(r.steps),
                    static_cast<long long>(loader.num_batches()), static_cast<long long>(params.clock()),
                    window_loss / static_cast<double>(window_samples),
                    static_cast<double>(window_correct) / static_cast<double>(window_samples), sps);
        std::fflush(stdout);
        window_loss = 0;
        window_samples = 0;
        window_correct = 0;
        t_window = now;
      }
    }
    auto t_trained = std::chrono::steady_clock::now();
    r.train_seconds = Seconds(t_epoch, t_trained);
    r.samples_per_second = static_cast<double>(r.samples) / std::max(1e-9, r.train_seconds);
    if (r.samples > 0) {
      r.train_loss = loss_sum / static_cast<double>(r.samples);
      r.train_accuracy = static_cast<double>(correct) / static_cast<double>(r.samples);
    }
    if (o.evaluate && test != nullptr) {
      LEASH_ASSIGN_OR_RETURN(StepStats ev, EvaluateAll(model, params, &values, *test));
      r.test_loss = ev.loss;
      r.test_accuracy = static_cast<double>(ev.correct) / static_cast<double>(test->count);
    }
    r.elapsed_seconds = Seconds(t_start, std::chrono::steady_clock::now());
    std::printf("%s epoch %lld/%lld done: train loss %.4f acc %.4f, %.0f samples/s%s\n", o.label.c_str(),
                static_cast<long long>(r.epoch), static_cast<long long>(o.epochs), r.train_loss, r.train_accuracy,
                r.samples_per_second,
                r.test_accuracy >= 0
                    ? (", test loss " + std::to_string(r.test_loss).substr(0, 6) + " test accuracy " +
                       std::to_string(r.test_accuracy * 100).substr(0, 5) + "%")
                          .c_str()
                    : "");
    std::fflush(stdout);
    results.push_back(r);
    if (stop != nullptr && stop->load()) {
      spdlog::info("stopping after epoch {} step {} as asked", r.epoch, r.steps);
      break;
    }
  }
  return results;
}

Status WriteResultsJson(const std::string& path, const std::string& mode, const TrainOptions& o,
                        const std::vector<EpochResult>& results) {
  std::ofstream f(path);
  if (!f) return IOError("cannot write results to '" + path + "'");
  f << "{\n  \"mode\": \"" << mode << "\",\n  \"batch\": " << o.batch << ",\n  \"worker_index\": " << o.worker_index
    << ",\n  \"num_workers\": " << o.num_workers << ",\n  \"epochs\": [\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const EpochResult& r = results[i];
    f << "    {\"epoch\": " << r.epoch << ", \"steps\": " << r.steps << ", \"samples\": " << r.samples
      << ", \"train_loss\": " << r.train_loss << ", \"train_accuracy\": " << r.train_accuracy
      << ", \"test_loss\": " << r.test_loss << ", \"test_accuracy\": " << r.test_accuracy
      << ", \"train_seconds\": " << r.train_seconds << ", \"samples_per_second\": " << r.samples_per_second
      << ", \"elapsed_seconds\": " << r.elapsed_seconds << "}" << (i + 1 < results.size() ? ",\n" : "\n");
  }
  f << "  ]\n}\n";
  if (!f) return IOError("error writing '" + path + "'");
  return Status::Ok();
}

}  // namespace leash::worker
