// The entry points of kernels.h: validate the arguments (InvalidArgument with the
// operation's name and the offending value), then switch on the context's device to the
// CPU kernels or the CUDA backend. Also the CPU kernels' scratch kept by each Context.
// Reentrant; a Context is used by one thread at a time.
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <new>
#include <string>
#include <utility>

#include "internal.h"
#include "leash/kernels/cpu.h"
#include "leash/kernels/kernels.h"

namespace leash::kernels {
namespace {

constexpr int64_t kMaxBlasDim = std::numeric_limits<int32_t>::max();

class Checker {
 public:
  explicit Checker(const char* op) : op_(op) {}

  // A count of elements: >= 0.
  Checker& Size(const char* name, int64_t v) {
    if (status_.ok() && v < 0) Fail(std::string(name) + " must be >= 0, got " + std::to_string(v));
    return *this;
  }
  // A matrix dimension: >= 0 and within the 32-bit BLAS interfaces.
  Checker& Dim(const char* name, int64_t v) {
    Size(name, v);
    if (status_.ok() && v > kMaxBlasDim) {
      Fail(std::string(name) + " = " + std::to_string(v) + " exceeds the BLAS limit " +
           std::to_string(kMaxBlasDim));
    }
    return *this;
  }
  // A pointer that will be dereferenced when `used`.
  Checker& Ptr(const char* name, const void* p, bool used) {
    if (status_.ok() && used && p == nullptr) Fail(std::string(name) + " is null");
    return *this;
  }
  Checker& Finite(const char* name, float v) {
    if (status_.ok() && !std::isfinite(v))
      Fail(std::string(name) + " must be finite, got " + std::to_string(v));
    return *this;
  }
  Checker& NonNegative(const char* name, float v) {
    Finite(name, v);
    if (status_.ok() && v < 0.f)
      Fail(std::string(name) + " must be >= 0, got " + std::to_string(v));
    return *this;
  }
  Checker& Beta(const char* name, float v) {
    NonNegative(name, v);
    if (status_.ok() && v >= 1.f)
      Fail(std::string(name) + " must be in [0, 1), got " + std::to_string(v));
    return *this;
  }
  // A size that must be at least 1, within the 32-bit interfaces.
  Checker& Positive(const char* name, int64_t v) {
    if (status_.ok() && v < 1) Fail(std::string(name) + " must be >= 1, got " + std::to_string(v));
    return Dim(name, v);
  }
  // A tensor whose dimensions (each already checked by Dim) multiply to at most
  // 2^31 - 1 elements, the 32-bit limit of BLAS and cuDNN.
  Checker& Elements(const char* what, std::initializer_list<int64_t> dims) {
    if (!status_.ok()) return *this;  // a dimension may be out of range: do not multiply
    int64_t product = 1;
    for (int64_t d : dims) {
      product *= d;  // both factors are <= 2^31, so this cannot overflow before the check
      if (product > kMaxBlasDim) {
        Fail(std::string(what) + " has more than " + std::to_string(kMaxBlasDim) +
             " elements, the 32-bit limit of BLAS and cuDNN");
        break;
      }
    }
    return *this;
  }
  Checker& That(bool ok, const std::string& why) {
    if (status_.ok() && !ok) Fail(why);
    return *this;
  }
  Status status() const { return status_; }

 private:
  void Fail(const std::string& why) { status_ = InvalidArgument(std::string(op_) + ": " + why); }
  const char* op_;
  Status status_;
};

// Elementwise ops: n >= 0 and every array present when n > 0.
Status CheckElementwise(const char* op, int64_t n,
                        std::initializer_list<std::pair<const char*, const void*>> ptrs) {
  Checker c(op);
  c.Size("n", n);
  for (const auto& [name, p] : ptrs) c.Ptr(name, p, n > 0);
  return c.status();
}

// A convolution's geometry, as Conv2dForward in kernels.h requires it.
Checker CheckConv2d(const char* op, const Conv2dShape& s) {
  Checker c(op);
  c.Dim("n", s.n)
      .Positive("c_in", s.c_in)
      .Positive("h", s.h)
      .Positive("w", s.w)
      .Positive("c_out", s.c_out);
  c.Positive("k", s.k).Dim("pad", s.pad);
  if (!c.status().ok()) return c;
  c.That(s.h_out() >= 1 && s.w_out() >= 1,
         "a " + std::to_string(s.k) + " x " + std::to_string(s.k) +
             " kernel does not fit in the padded " + std::to_string(s.h + 2 * s.pad) + " x " +
             std::to_string(s.w + 2 * s.pad) + " image (h = " + std::to_string(s.h) +
             ", w = " + std::to_string(s.w) + ", pad = " + std::to_string(s.pad) + ")");
  c.Dim("h_out", s.h_out()).Dim("w_out", s.w_out());
  c.Elements("x (n x c_in x h x w)", {s.n, s.c_in, s.h, s.w});
  c.Elements("y (n x c_out x h_out x w_out)", {s.n, s.c_out, s.h_out(), s.w_out()});
  c.Elements("weight (c_out x c_in x k x k)", {s.c_out, s.c_in, s.k, s.k});
  c.Elements("the patch matrix of an image (c_in k k x h_out w_out)",
             {s.c_in, s.k, s.k, s.h_out(), s.w_out()});
  return c;
}

// The sizes of 2 x 2 max pooling.
Checker CheckMaxPool2d(const char* op, int64_t n, int64_t c, int64_t h, int64_t w) {
  Checker check(op);
  check.Dim("n", n).Dim("c", c).Dim("h", h).Dim("w", w);
  check.That(h >= 2 && w >= 2, "h and w must be >= 2 to hold a 2 x 2 window, got h = " +
                                   std::to_string(h) + ", w = " + std::to_string(w));
  check.Elements("x (n x c x h x w)", {n, c, h, w});
  return check;
}

}  // namespace

namespace internal {

// Reaches the CPU kernels' scratch that every Context keeps (kernels.h).
class HostScratch {
 public:
  // At least `count` floats of uninitialized host memory, valid until the next call on
  // `ctx`. Grows (freeing the smaller block) only when `count` exceeds every earlier
  // request, so a training loop allocates on its first step and never again.
  static Result<float*> Get(Context& ctx, int64_t count) {
    const auto needed = static_cast<size_t>(count);
    if (needed > ctx.host_scratch_size_) {
      ctx.host_scratch_.reset();
      ctx.host_scratch_size_ = 0;
      ctx.host_scratch_.reset(new (std::nothrow) float[needed]);
      if (ctx.host_scratch_ == nullptr) {
        return ResourceExhausted("out of host memory allocating " +
                                 std::to_string(needed * sizeof(float)) +
                                 " bytes of convolution scratch");
      }
      ctx.host_scratch_size_ = needed;
    }
    return ctx.host_scratch_.get();
  }
};

}  // namespace internal

using internal::OnCuda;

Status Gemm(Context& ctx, Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, const float* b, float beta, float* c) {
  Checker check("Gemm");
  check.Dim("m", m).Dim("n", n).Dim("k", k);
  const bool writes = m > 0 && n > 0;
  check.Ptr("a", a, writes && k > 0).Ptr("b", b, writes && k > 0).Ptr("c", c, writes);
  LEASH_RETURN_IF_ERROR(check.status());
  switch (ctx.device().type) {
    case DeviceType::kCpu:
      cpu::Gemm(ta, tb, m, n, k, alpha, a, b, beta, c);
      return Status::Ok();
    case DeviceType::kCuda:
      return OnCuda(ctx,
                    [&](auto& s) { return cuda::Gemm(s, ta, tb, m, n, k, alpha, a, b, beta, c); });
  }
  return InvalidArgument("Gemm: unknown device type");
}

Status BiasAdd(Context& ctx, int64_t rows, int64_t cols, const float* bias, float* y) {
  Checker check("BiasAdd");
  check.Dim("rows", rows)
      .Dim("cols", cols)
      .Ptr("bias", bias, rows > 0 && cols > 0)
      .Ptr("y", y, rows > 0 && cols > 0);
  LEASH_RETURN_IF_ERROR(check.status());
  switch (ctx.device().type) {
    case DeviceType::kCpu:
      cpu::BiasAdd(rows, cols, bias, y);
      return Status::Ok();
    case DeviceType::kCuda:
      return OnCuda(ctx, [&](auto& s) { return cuda::BiasAdd(s, rows, cols, bias, y); });
  }
  return InvalidArgument("BiasAdd: unknown device type");
}

Status BiasGrad(Context& ctx, int64_t rows, int64_t cols, const float* dy, float* db) {
  Checker check("BiasGrad");
  check.Dim("rows", rows)
      .Dim("cols", cols)
      .Ptr("dy", dy, rows > 0 && cols > 0)
      .Ptr("db", db, cols > 0);
  LEASH_RETURN_IF_ERROR(check.status());
  switch (ctx.device().type) {
    case DeviceType::kCpu:
      cpu::BiasGrad(rows, cols, dy, db);
      return Status::Ok();
    case DeviceType::kCuda:
      return OnCuda(ctx, [&](auto& s) { return cuda::BiasGrad(s, rows, cols, dy, db); });
  }
  return InvalidArgument("BiasGrad: unknown device type");
}

Status Relu(Context& ctx, int64_t n, const float* x, float* y) {
  LEASH_RETURN_IF_ERROR(CheckElementwise("Relu", n, {{"x", x}, {"y", y}}));
  switch (ctx.device().type) {
    case DeviceType::kCpu:
      cpu::Relu(n, x, y);
      return Status::Ok();
    case DeviceType::kCuda:
      return OnCuda(ctx, [&](auto& s) { return cuda::Relu(s, n, x, y); });
  }
  return InvalidArgument("Relu: unknown device type");
}

Status ReluBackward(Context& ctx, int64_t n, const float* y, const float* dy, float* dx) {
  LEASH_RETURN_IF_ERROR(CheckElementwise("ReluBackward", n, {{"y", y}, {"dy", dy}, {"dx", dx}}));
  switch (ctx.device().type) {
    case DeviceType::kCpu:
      cpu::ReluBackward(n, y, dy, dx);
      return Status::Ok();
    case DeviceType::kCuda:
      return OnCuda(ctx, [&](auto& s) { return cuda::ReluBackward(s, n, y, dy, dx); });
  }
  return InvalidArgument("ReluBackward: unknown device type");
}

Status Conv2dForward(Context& ctx, int64_t n, int64_t c_in, int64_t h, int64_t w, int64_t c_out,
                     int64_t k, int64_t pad, const float* x, const float* weight, float* y) {
  const Conv2dShape s{n, c_in, h, w, c_out, k, pad};
  Checker check = CheckConv2d("Conv2dForward", s);
  check.Ptr("x", x, n > 0).Ptr("weight", weight, n > 0).Ptr("y", y, n > 0);
  LEASH_RETURN_IF_ERROR(check.status());
  if (n == 0) return Status::Ok();
  switch (ctx.device().type) {
    case DeviceType::kCpu: {
      LEASH_ASSIGN_OR_RETURN(float* scratch,
                             internal::HostScratch::Get(ctx, cpu::Conv2dScratchSize(s)));
      cpu::Conv2dForward(s, x, weight, y, scratch);
      return Status::Ok();
    }
    case DeviceType::kCuda:
      return OnCuda(ctx, [&](auto& st) { return cuda::Conv2dForward(st, s, x, weight, y); });
  }
  return InvalidArgument("Conv2dForward: unknown device type");
}

Status Conv2dBackwardData(Context& ctx, int64_t n, int64_t c_in, int64_t h, int64_t w,
                          int64_t c_out, int64_t k, int64_t pad, const float* dy,
                          const float* weight, float* dx) {
  const Conv2dShape s{n, c_in, h, w, c_out, k, pad};
  Checker check = CheckConv2d("Conv2dBackwardData", s);
  check.Ptr("dy", dy, n > 0).Ptr("weight", weight, n > 0).Ptr("dx", dx, n > 0);
  LEASH_RETURN_IF_ERROR(check.status());
  if (n == 0) return Status::Ok();
  switch (ctx.device().type) {
    case DeviceType::kCpu: {
      LEASH_ASSIGN_OR_RETURN(float* scratch,
                             internal::HostScratch::Get(ctx, cpu::Conv2dScratchSize(s)));
      cpu::Conv2dBackwardData(s, dy, weight, dx, scratch);
      return Status::Ok();
    }
    case DeviceType::kCuda:
      return OnCuda(ctx, [&](auto& st) { return cuda::Conv2dBackwardData(st, s, dy, weight, dx); });
  }
  return InvalidArgument("Conv2dBackwardData: unknown device type");
}

Status Conv2dBackwardWeight(Context& ctx, int64_t n, int64_t c_in, int64_t h, int64_t w,
                            int64_t c_out, int64_t k, int64_t pad, const float* x, const float* dy,
                            float* dweight) {
  const Conv2dShape s{n, c_in, h, w, c_out, k, pad};
  Checker check = CheckConv2d("Conv2dBackwardWeight", s);
  check.Ptr("x", x, n > 0).Ptr("dy", dy, n > 0).Ptr("dweight", dweight, true);
  LEASH_RETURN_IF_ERROR(check.status());
  switch (ctx.device().type) {
    case DeviceType::kCpu: {
      LEASH_ASSIGN_OR_RETURN(
          float* scratch, internal::HostScratch::Get(ctx, n > 0 ? cpu::Conv2dScratchSize(s) : 0));
      cpu::Conv2dBackwardWeight(s, x, dy, dweight, scratch);
      return Status::Ok();
    }
    case DeviceType::kCuda:
      return OnCuda(ctx,
                    [&](auto& st) { return cuda::Conv2dBackwardWeight(st, s, x, dy, dweight); });
  }
  return InvalidArgument("Conv2dBackwardWeight: unknown device type");
}

Status BiasAddChannels(Context& ctx, int64_t n, int64_t c, int64_t hw, const float* bias,
                       float* y) {
  Checker check("BiasAddChannels");
  check.Dim("n", n).Dim("c", c).Dim("hw", hw).Elements("y (n x c x hw)", {n, c, hw});
  const bool any = n > 0 && c > 0 && hw > 0;
  check.Ptr("bias", bias, any).Ptr("y", y, any);
  LEASH_RETURN_IF_ERROR(check.status());
  if (!any) return Status::Ok();
  switch (ctx.device().type) {
    case DeviceType::kCpu:
      cpu::BiasAddChannels(n, c, hw, bias, y);
      return Status::Ok();
    case DeviceType::kCuda:
      return OnCuda(ctx, [&](auto& st) { return cuda::BiasAddChannels(st, n, c, hw, bias, y); });
  }
  return InvalidArgument("BiasAddChannels: unknown device type");
}

Status BiasGradChannels(Context& ctx, int64_t n, int64_t c, int64_t hw, const float* dy,
                        float* db) {
  Checker check("BiasGradChannels");
  check.Dim("n", n).Dim("c", c).Dim("hw", hw).Elements("dy (n x c x hw)", {n, c, hw});
  check.Ptr("dy", dy, n > 0 && c > 0 && hw > 0).Ptr("db", db, c > 0);
  LEASH_RETURN_IF_ERROR(check.status());
  if (c == 0) return Status::Ok();
  switch (ctx.device().type) {
    case DeviceType::kCpu:
      cpu::BiasGradChannels(n, c, hw, dy, db);
      return Status::Ok();
    case DeviceType::kCuda:
      return OnCuda(ctx, [&](auto& st) { return cuda::BiasGradChannels(st, n, c, hw, dy, db); });
  }
  return InvalidArgument("BiasGradChannels: unknown device type");
}

Status MaxPool2dForward(Context& ctx, int64_t n, int64_t c, int64_t h, int64_t w, const float* x,
                        float* y) {
  Checker check = CheckMaxPool2d("MaxPool2dForward", n, c, h, w);
  check.Ptr("x", x, n > 0 && c > 0).Ptr("y", y, n > 0 && c > 0);
  LEASH_RETURN_IF_ERROR(check.status());
  if (n == 0 || c == 0) return Status::Ok();
  switch (ctx.device().type) {
    case DeviceType::kCpu:
      cpu::MaxPool2dForward(n, c, h, w, x, y);
      return Status::Ok();
    case DeviceType::kCuda:
      return OnCuda(ctx, [&](auto& st) { return cuda::MaxPool2dForward(st, n, c, h, w, x, y); });
  }
  return InvalidArgument("MaxPool2dForward: unknown device type");
}

Status MaxPool2dBackward(Context& ctx, int64_t n, int64_t c, int64_t h, int64_t w, const float* x,
                         const float* y, const float* dy, float* dx) {
  Checker check = CheckMaxPool2d("MaxPool2dBackward", n, c, h, w);
  const bool any = n > 0 && c > 0;
  check.Ptr("x", x, any).Ptr("y", y, any).Ptr("dy", dy, any).Ptr("dx", dx, any);
  LEASH_RETURN_IF_ERROR(check.status());
  if (!any) return Status::Ok();
  switch (ctx.device().type) {
    case DeviceType::kCpu:
      cpu::MaxPool2dBackward(n, c, h, w, x, dy, dx);
      return Status::Ok();
    case DeviceType::kCuda:
      return OnCuda(
          ctx, [&](auto& st) { return cuda::MaxPool2dBackward(st, n, c, h, w, x, y, dy, dx); });
  }
  return InvalidArgument("MaxPool2dBackward: unknown device type");
}

Status SoftmaxCrossEntropy(Context& ctx, int64_t rows, int64_t classes, const float* logits,
                           const int32_t* labels, float* dlogits, float* loss_host,
                           int64_t* correct_host) {
  Checker check("SoftmaxCrossEntropy");
  check.Dim("rows", rows).Dim("classes", classes);
  check.That(rows == 0 || classes > 0, "classes must be > 0 when rows > 0");
  check.Ptr("logits", logits, rows > 0).Ptr("labels", labels, rows > 0);
  LEASH_RETURN_IF_ERROR(check.status());
  switch (ctx.device().type) {
    case DeviceType::kCpu:
      for (int64_t r = 0; r < rows; ++r) {
        if (labels[r] < 0 || labels[r] >= classes) {
          return InvalidArgument("SoftmaxCrossEntropy: label " + std::to_string(labels[r]) +
                                 " of row " + std::to_string(r) + " is outside [0, " +
                                 std::to_string(classes) + ")");
        }
      }
      cpu::SoftmaxCrossEntropy(rows, classes, logits, labels, dlogits, loss_host, correct_host);
      return Status::Ok();
    case DeviceType::kCuda:
      return OnCuda(ctx, [&](auto& s) {
        return cuda::SoftmaxCrossEntropy(s, rows, classes, logits, labels, dlogits, loss_host,
                                         correct_host);
      });
  }
  return InvalidArgument("SoftmaxCrossEntropy: unknown device type");
}

Status SgdUpdate(Context& ctx, int64_t n, const SgdParams& p, const float* g, float* w) {
  LEASH_RETURN_IF_ERROR(CheckElementwise("SgdUpdate", n, {{"g", g}, {"w", w}}));
  LEASH_RETURN_IF_ERROR(
      Checker("SgdUpdate").Finite("lr", p.lr).Finite("weight_decay", p.weight_decay).status());
  switch (ctx.device().type) {
    case DeviceType::kCpu:
      cpu::SgdUpdate(n, p, g, w);
      return Status::Ok();
    case DeviceType::kCuda:
      return OnCuda(ctx, [&](auto& s) { return cuda::SgdUpdate(s, n, p, g, w); });
  }
  return InvalidArgument("SgdUpdate: unknown device type");
}

Status MomentumUpdate(Context& ctx, int64_t n, const MomentumParams& p, const float* g, float* w,
                      float* v) {
  LEASH_RETURN_IF_ERROR(CheckElementwise("MomentumUpdate", n, {{"g", g}, {"w", w}, {"v", v}}));
  LEASH_RETURN_IF_ERROR(Checker("MomentumUpdate")
                            .Finite("lr", p.lr)
                            .Finite("momentum", p.momentum)
                            .Finite("weight_decay", p.weight_decay)
                            .status());
  switch (ctx.device().type) {
    case DeviceType::kCpu:
      cpu::MomentumUpdate(n, p, g, w, v);
      return Status::Ok();
    case DeviceType::kCuda:
      return OnCuda(ctx, [&](auto& s) { return cuda::MomentumUpdate(s, n, p, g, w, v); });
  }
  return InvalidArgument("MomentumUpdate: unknown device type");
}

Status AdamUpdate(Context& ctx, int64_t n, const AdamParams& p, int64_t step, const float* g,
                  float* w, float* m, float* v) {
  LEASH_RETURN_IF_ERROR(
      CheckElementwise("AdamUpdate", n, {{"g", g}, {"w", w}, {"m", m}, {"v", v}}));
  LEASH_RETURN_IF_ERROR(Checker("AdamUpdate")
                            .Finite("lr", p.lr)
                            .Beta("beta1", p.beta1)
                            .Beta("beta2", p.beta2)
                            .NonNegative("epsilon", p.epsilon)
                            .Finite("weight_decay", p.weight_decay)
                            .status());
  if (step < 1) return InvalidArgument("AdamUpdate: step is 1-based, got " + std::to_string(step));
  switch (ctx.device().type) {
    case DeviceType::kCpu:
      cpu::AdamUpdate(n, p, step, g, w, m, v);
      return Status::Ok();
    case DeviceType::kCuda:
      return OnCuda(ctx, [&](auto& s) { return cuda::AdamUpdate(s, n, p, step, g, w, m, v); });
  }
  return InvalidArgument("AdamUpdate: unknown device type");
}

Status AdagradUpdate(Context& ctx, int64_t n, const AdagradParams& p, const float* g, float* w,
                     float* acc) {
  LEASH_RETURN_IF_ERROR(CheckElementwise("AdagradUpdate", n, {{"g", g}, {"w", w}, {"acc", acc}}));
  LEASH_RETURN_IF_ERROR(Checker("AdagradUpdate")
                            .Finite("lr", p.lr)
                            .NonNegative("epsilon", p.epsilon)
                            .Finite("weight_decay", p.weight_decay)
                            .status());
  switch (ctx.device().type) {
    case DeviceType::kCpu:
      cpu::AdagradUpdate(n, p, g, w, acc);
      return Status::Ok();
    case DeviceType::kCuda:
      return OnCuda(ctx, [&](auto& s) { return cuda::AdagradUpdate(s, n, p, g, w, acc); });
  }
  return InvalidArgument("AdagradUpdate: unknown device type");
}

Status ConvertToHalf(Context& ctx, int64_t n, const float* x, uint16_t* y, bool bf16) {
  LEASH_RETURN_IF_ERROR(CheckElementwise("ConvertToHalf", n, {{"x", x}, {"y", y}}));
  switch (ctx.device().type) {
    case DeviceType::kCpu:
      cpu::ConvertToHalf(n, x, y, bf16);
      return Status::Ok();
    case DeviceType::kCuda:
      return OnCuda(ctx, [&](auto& s) { return cuda::ConvertToHalf(s, n, x, y, bf16); });
  }
  return InvalidArgument("ConvertToHalf: unknown device type");
}

Status ConvertFromHalf(Context& ctx, int64_t n, const uint16_t* x, float* y, bool bf16) {
  LEASH_RETURN_IF_ERROR(CheckElementwise("ConvertFromHalf", n, {{"x", x}, {"y", y}}));
  switch (ctx.device().type) {
    case DeviceType::kCpu:
      cpu::ConvertFromHalf(n, x, y, bf16);
      return Status::Ok();
    case DeviceType::kCuda:
      return OnCuda(ctx, [&](auto& s) { return cuda::ConvertFromHalf(s, n, x, y, bf16); });
  }
  return InvalidArgument("ConvertFromHalf: unknown device type");
}

}  // namespace leash::kernels
