// The CPU convolution, channel-bias and max-pooling kernels on NCHW tensors. Convolutions
// lower one image at a time to its patch matrix (im2col) and multiply with OpenBLAS
// through cpu::Gemm; pooling and biases are plain loops. Reentrant: all state is in the
// caller's arrays and scratch.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "leash/kernels/cpu.h"

namespace leash::kernels::cpu {
namespace {

// A 1x1 kernel without padding reads every pixel once, in place: its patch matrix is the
// image itself (c_in rows of h w), so no copy is needed.
bool IsPointwise(const Conv2dShape& s) { return s.k == 1 && s.pad == 0; }

// Columns [lo, hi) of an output row read input columns inside the image for kernel column
// `b`: 0 <= ow + b - pad < w.
struct ValidColumns {
  int64_t lo;
  int64_t hi;
};
ValidColumns ValidFor(const Conv2dShape& s, int64_t b) {
  const int64_t w_out = s.w_out();
  const int64_t lo = std::clamp(s.pad - b, int64_t{0}, w_out);
  const int64_t hi = std::clamp(s.w + s.pad - b, lo, w_out);
  return {lo, hi};
}

// col[(c k + a) k + b][oh w_out + ow] = x[c][oh + a - pad][ow + b - pad], zero outside.
void Im2Col(const Conv2dShape& s, const float* x, float* col) {
  const int64_t h_out = s.h_out(), w_out = s.w_out();
  float* out = col;
  for (int64_t c = 0; c < s.c_in; ++c) {
    const float* plane = x + c * s.h * s.w;
    for (int64_t a = 0; a < s.k; ++a) {
      for (int64_t b = 0; b < s.k; ++b) {
        const ValidColumns v = ValidFor(s, b);
        const int64_t shift = b - s.pad;
        for (int64_t oh = 0; oh < h_out; ++oh, out += w_out) {
          const int64_t ih = oh + a - s.pad;
          if (ih < 0 || ih >= s.h) {
            std::fill(out, out + w_out, 0.f);
            continue;
          }
          const float* row = plane + ih * s.w;
          std::fill(out, out + v.lo, 0.f);
          for (int64_t ow = v.lo; ow < v.hi; ++ow) out[ow] = row[ow + shift];
          std::fill(out + v.hi, out + w_out, 0.f);
        }
      }
    }
  }
}

// The adjoint of Im2Col: dx[c][ih][iw] = sum of the patch entries that read it. dx is
// overwritten.
void Col2Im(const Conv2dShape& s, const float* col, float* dx) {
  const int64_t h_out = s.h_out(), w_out = s.w_out();
  std::fill(dx, dx + s.c_in * s.h * s.w, 0.f);
  const float* in = col;
  for (int64_t c = 0; c < s.c_in; ++c) {
    float* plane = dx + c * s.h * s.w;
    for (int64_t a = 0; a < s.k; ++a) {
      for (int64_t b = 0; b < s.k; ++b) {
        const ValidColumns v = ValidFor(s, b);
        const int64_t shift = b - s.pad;
        for (int64_t oh = 0; oh < h_out; ++oh, in += w_out) {
          const int64_t ih = oh + a - s.pad;
          if (ih < 0 || ih >= s.h) continue;
          float* row = plane + ih * s.w;
          for (int64_t ow = v.lo; ow < v.hi; ++ow) row[ow + shift] += in[ow];
        }
      }
    }
  }
}

// `pick_first ? x : y` by masking the bits: a plain select between floats compiles to a
// branch, which random activations mispredict half of the time.
inline float Select(bool pick_first, float x, float y) {
  uint32_t bx, by;
  std::memcpy(&bx, &x, sizeof bx);
  std::memcpy(&by, &y, sizeof by);
  const uint32_t mask = 0u - static_cast<uint32_t>(pick_first);
  const uint32_t bits = (bx & mask) | (by & ~mask);
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

// The maximum of a 2 x 2 window and where it is (row and column 0 or 1); the first in
// row-major order wins ties. A tournament of the two rows, without branches.
struct WindowMax {
  float value;
  int row;
  int column;
};
inline WindowMax MaxOfWindow(const float* top, const float* bottom) {
  const bool right_top = top[1] > top[0];
  const float top_max = Select(right_top, top[1], top[0]);
  const bool right_bottom = bottom[1] > bottom[0];
  const float bottom_max = Select(right_bottom, bottom[1], bottom[0]);
  const bool bottom_wins = bottom_max > top_max;
  const int row = bottom_wins;
  // Arithmetic rather than `row ? right_bottom : right_top`, which becomes a branch.
  const int column =
      right_top + row * (static_cast<int>(right_bottom) - static_cast<int>(right_top));
  return {Select(bottom_wins, bottom_max, top_max), row, column};
}

}  // namespace

int64_t Conv2dScratchSize(const Conv2dShape& s) {
  return IsPointwise(s) ? 0 : s.patch_rows() * s.h_out() * s.w_out();
}

void Conv2dForward(const Conv2dShape& s, const float* x, const float* weight, float* y,
                   float* scratch) {
  const int64_t pixels = s.h_out() * s.w_out();
  for (int64_t i = 0; i < s.n; ++i) {
    const float* image = x + i * s.c_in * s.h * s.w;
    const float* col = image;
    if (!IsPointwise(s)) {
      Im2Col(s, image, scratch);
      col = scratch;
    }
    // y_i (c_out x pixels) = W (c_out x c_in k k) * col (c_in k k x pixels).
    Gemm(Transpose::kNo, Transpose::kNo, s.c_out, pixels, s.patch_rows(), 1.f, weight, col, 0.f,
         y + i * s.c_out * pixels);
  }
}

void Conv2dBackwardData(const Conv2dShape& s, const float* dy, const float* weight, float* dx,
                        float* scratch) {
  const int64_t pixels = s.h_out() * s.w_out();
  for (int64_t i = 0; i < s.n; ++i) {
    float* dimage = dx + i * s.c_in * s.h * s.w;
    float* dcol = IsPointwise(s) ? dimage : scratch;
    // dcol (c_in k k x pixels) = W^T * dy_i, then each patch entry goes back to its pixel.
    Gemm(Transpose::kYes, Transpose::kNo, s.patch_rows(), pixels, s.c_out, 1.f, weight,
         dy + i * s.c_out * pixels, 0.f, dcol);
    if (!IsPointwise(s)) Col2Im(s, dcol, dimage);
  }
}

void Conv2dBackwardWeight(const Conv2dShape& s, const float* x, const float* dy, float* dweight,
                          float* scratch) {
  if (s.n == 0) {
    std::fill(dweight, dweight + s.c_out * s.patch_rows(), 0.f);
    return;
  }
  const int64_t pixels = s.h_out() * s.w_out();
  for (int64_t i = 0; i < s.n; ++i) {
    const float* image = x + i * s.c_in * s.h * s.w;
    const float* col = image;
    if (!IsPointwise(s)) {
      Im2Col(s, image, scratch);
      col = scratch;
    }
    // dW (c_out x c_in k k) (+)= dy_i (c_out x pixels) * col^T; the first image overwrites.
    Gemm(Transpose::kNo, Transpose::kYes, s.c_out, s.patch_rows(), pixels, 1.f,
         dy + i * s.c_out * pixels, col, i == 0 ? 0.f : 1.f, dweight);
  }
}

void BiasAddChannels(int64_t n, int64_t c, int64_t hw, const float* bias, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t ch = 0; ch < c; ++ch) {
      float* plane = y + (i * c + ch) * hw;
      const float b = bias[ch];
      for (int64_t p = 0; p < hw; ++p) plane[p] += b;
    }
  }
}

void BiasGradChannels(int64_t n, int64_t c, int64_t hw, const float* dy, float* db) {
  for (int64_t ch = 0; ch < c; ++ch) {
    // Summed in double per channel: a channel gathers n * hw terms, easily 10^5.
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const float* plane = dy + (i * c + ch) * hw;
      float partial = 0.f;
      for (int64_t p = 0; p < hw; ++p) partial += plane[p];
      sum += partial;
    }
    db[ch] = static_cast<float>(sum);
  }
}

void MaxPool2dForward(int64_t n, int64_t c, int64_t h, int64_t w, const float* x, float* y) {
  const int64_t h_out = h / 2, w_out = w / 2;
  for (int64_t plane = 0; plane < n * c; ++plane) {
    const float* in = x + plane * h * w;
    float* out = y + plane * h_out * w_out;
    for (int64_t oh = 0; oh < h_out; ++oh) {
      const float* top = in + 2 * oh * w;
      const float* bottom = top + w;
      for (int64_t ow = 0; ow < w_out; ++ow) {
        out[oh * w_out + ow] = MaxOfWindow(top + 2 * ow, bottom + 2 * ow).value;
      }
    }
  }
}

void MaxPool2dBackward(int64_t n, int64_t c, int64_t h, int64_t w, const float* x, const float* dy,
                       float* dx) {
  const int64_t h_out = h / 2, w_out = w / 2;
  std::fill(dx, dx + n * c * h * w, 0.f);
  for (int64_t plane = 0; plane < n * c; ++plane) {
    const float* in = x + plane * h * w;
    const float* grad = dy + plane * h_out * w_out;
    float* din = dx + plane * h * w;
    for (int64_t oh = 0; oh < h_out; ++oh) {
      for (int64_t ow = 0; ow < w_out; ++ow) {
        const int64_t top = 2 * oh * w + 2 * ow;
        const WindowMax m = MaxOfWindow(in + top, in + top + w);
        din[top + m.row * w + m.column] = grad[oh * w_out + ow];
      }
    }
  }
}

}  // namespace leash::kernels::cpu
