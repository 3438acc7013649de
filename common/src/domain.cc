// Names and sizes of the domain enums (domain.h). Thread-safe (no state).
#include "leash/common/domain.h"

#include <string>

namespace leash {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "fp32";
    case DType::kF16:
      return "fp16";
    case DType::kBF16:
      return "bf16";
  }
  return "unknown";
}

Result<DType> ParseDType(std::string_view name) {
  if (name == "fp32" || name == "f32" || name == "float32") return DType::kF32;
  if (name == "fp16" || name == "f16" || name == "float16") return DType::kF16;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  return InvalidArgument("unknown dtype '" + std::string(name) + "' (expected fp32, fp16 or bf16)");
}

const char* OptimizerName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kMomentum:
      return "momentum";
    case OptimizerKind::kAdam:
      return "adam";
    case OptimizerKind::kAdagrad:
      return "adagrad";
    case OptimizerKind::kFtrl:
      return "ftrl";
  }
  return "unknown";
}

Result<OptimizerKind> ParseOptimizer(std::string_view name) {
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "momentum") return OptimizerKind::kMomentum;
  if (name == "adam") return OptimizerKind::kAdam;
  if (name == "adagrad") return OptimizerKind::kAdagrad;
  if (name == "ftrl") return OptimizerKind::kFtrl;
  return InvalidArgument("unknown optimizer '" + std::string(name) +
                         "' (expected sgd, momentum, adam, adagrad or ftrl)");
}

const char* TableKindName(TableKind kind) {
  switch (kind) {
    case TableKind::kDense:
      return "dense";
    case TableKind::kSparse:
      return "sparse";
  }
  return "unknown";
}

}  // namespace leash
