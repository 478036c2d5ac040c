// Elementwise and normalising kernels: SiLU, tanh GELU, GroupNorm (with SiLU), RMS norm with
// residual, SiLU gate.
#include "cpu_common.h"

using namespace mlxs::detail;

namespace {

MLXS_VECTOR_CLONES void silu_f32(const float* __restrict x, float* __restrict y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = silu_one(x[i]);
}

// ½x(1 + tanh u) with u = √(2/π)(x + 0.044715x³), written as x · sigmoid(2u): 1 + tanh u is
// 2/(1 + e^(−2u)), so one vectorised exp replaces libm's scalar tanh (which MLX's CPU backend
// calls per element, on one thread) and no cancellation near u = 0 costs accuracy.
MLXS_VECTOR_CLONES void gelu_tanh_f32(const float* __restrict x, float* __restrict y, size_t n) {
  const float two_k = 2.0f * 0.7978845608028654f;
  for (size_t i = 0; i < n; ++i) {
    const float v = x[i];
    float e = -two_k * (v + 0.044715f * v * v * v);
    e = e < -87.0f ? -87.0f : e;
    e = e > 87.0f ? 87.0f : e;
    y[i] = v / (1.0f + exp_bounded(e));
  }
}

// GroupNorm's three passes over one image's [rows, c] pixels: per-channel sums, per-channel
// sums of squared deviations from the group means, then y = x·scale + shift per channel, with
// SiLU when asked. Rows are summed in f32 in blocks and the blocks in f64, so that a channel of
// a million pixels keeps its precision.
constexpr size_t kSumBlock = 256;

MLXS_VECTOR_CLONES void channel_sums(const float* __restrict x, size_t rows, size_t c, const float* __restrict centre,
                                     float* __restrict block, double* __restrict out) {
  for (size_t j = 0; j < c; ++j) out[j] = 0.0;
  for (size_t r0 = 0; r0 < rows; r0 += kSumBlock) {
    size_t r1 = r0 + kSumBlock < rows ? r0 + kSumBlock : rows;
    for (size_t j = 0; j < c; ++j) block[j] = 0.0f;
    for (size_t r = r0; r < r1; ++r) {
      const float* row = x + r * c;
      if (centre) {
        for (size_t j = 0; j < c; ++j) {
          float d = row[j] - centre[j];
          block[j] += d * d;
        }
      } else {
        for (size_t j = 0; j < c; ++j) block[j] += row[j];
      }
    }
    for (size_t j = 0; j < c; ++j) out[j] += block[j];
  }
}

MLXS_VECTOR_CLONES void scale_shift(const float* __restrict x, float* __restrict y, size_t rows, size_t c,
                                    const float* __restrict scale, const float* __restrict shift, bool silu) {
  for (size_t r = 0; r < rows; ++r) {
    const float* in = x + r * c;
    float* o = y + r * c;
    if (silu) {
      for (size_t j = 0; j < c; ++j) o[j] = silu_one(in[j] * scale[j] + shift[j]);
    } else {
      for (size_t j = 0; j < c; ++j) o[j] = in[j] * scale[j] + shift[j];
    }
  }
}

// GroupNorm (PyTorch's grouping: consecutive channels) over [B, H, W, C] float32, optionally
// followed by SiLU, as one MLX primitive: three passes over memory where the composed ops take ten.
class CpuGroupNorm : public CpuOnlyPrimitive {
 public:
  CpuGroupNorm(mx::Stream stream, int groups, float eps, bool silu)
      : CpuOnlyPrimitive(stream, "CpuGroupNorm"), groups_(groups), eps_(eps), silu_(silu) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const mx::array& x = inputs[0];
    const mx::array& weight = inputs[1];
    const mx::array& bias = inputs[2];
    auto& encoder = begin(inputs, out);
    size_t batch = x.shape(0), c = x.shape(-1), rows = x.size() / (batch * c);
    encoder.dispatch([x, weight, bias, src = x.data<float>(), dst = out.data<float>(), w = weight.data<float>(),
                      b = bias.data<float>(), batch, rows, c, groups = static_cast<size_t>(groups_), eps = eps_,
                      silu = silu_]() {
      const size_t workers = worker_count();
      // Per worker: its rows' channel sums, and a block accumulator.
      std::vector<double> partial(workers * c), sums(c);
      std::vector<float> blocks(workers * c), centre(c), scale(c), shift(c);
      size_t per_group = c / groups;
      double count = static_cast<double>(rows) * per_group;
      // Channel sums of x (centre == nullptr) or of (x − centre)², over all rows.
      auto sum_channels = [&](const float* xin, const float* centre) {
        std::fill(partial.begin(), partial.end(), 0.0);
        parallel_for(rows, c, [&](size_t r0, size_t r1, size_t t) {
          channel_sums(xin + r0 * c, r1 - r0, c, centre, blocks.data() + t * c, partial.data() + t * c);
        });
        for (size_t j = 0; j < c; ++j) {
          sums[j] = 0.0;
          for (size_t t = 0; t < workers; ++t) sums[j] += partial[t * c + j];
        }
      };
      for (size_t n = 0; n < batch; ++n) {
        const float* xin = src + n * rows * c;
        // Group means, broadcast back to every channel of the group.
        sum_channels(xin, nullptr);
        for (size_t g = 0; g < groups; ++g) {
          double s = 0.0;
          for (size_t j = g * per_group; j < (g + 1) * per_group; ++j) s += sums[j];
          for (size_t j = g * per_group; j < (g + 1) * per_group; ++j) centre[j] = static_cast<float>(s / count);
        }
        sum_channels(xin, centre.data());
        for (size_t g = 0; g < groups; ++g) {
          double s = 0.0;
          for (size_t j = g * per_group; j < (g + 1) * per_group; ++j) s += sums[j];
          float inv_std = static_cast<float>(1.0 / std::sqrt(s / count + eps));
          for (size_t j = g * per_group; j < (g + 1) * per_group; ++j) {
            scale[j] = w[j] * inv_std;
            shift[j] = b[j] - centre[j] * scale[j];
          }
        }
        parallel_for(rows, c, [&](size_t r0, size_t r1, size_t) {
          scale_shift(xin + r0 * c, dst + (n * rows + r0) * c, r1 - r0, c, scale.data(), shift.data(), silu);
        });
      }
    });
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto o = dynamic_cast<const CpuGroupNorm*>(&other);
    return o != nullptr && o->groups_ == groups_ && o->eps_ == eps_ && o->silu_ == silu_;
  }

 private:
  int groups_;
  float eps_;
  bool silu_;
};

using Kernel = void (*)(const float*, float*, size_t);

// A float32 elementwise kernel as an MLX primitive on a CPU stream.
class CpuElementwise : public CpuOnlyPrimitive {
 public:
  CpuElementwise(mx::Stream stream, Kernel kernel, const char* name)
      : CpuOnlyPrimitive(stream, name), kernel_(kernel) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const mx::array& x = inputs[0];
    auto& encoder = begin(inputs, out);
    encoder.dispatch([x, kernel = kernel_, src = x.data<float>(), dst = out.data<float>(), n = x.size()]() {
      parallel_for(n, 1, [&](size_t begin, size_t end, size_t) { kernel(src + begin, dst + begin, end - begin); });
    });
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto o = dynamic_cast<const CpuElementwise*>(&other);
    return o != nullptr && o->kernel_ == kernel_;
  }

 private:
  Kernel kernel_;
};

// The kernel for float32 on a CPU stream, `fallback` otherwise.
template <typename F>
mx::array elementwise(const mx::array& x, Kernel kernel, const char* name, F fallback) {
  auto stream = mx::default_stream(mx::default_device());
  if (x.dtype() != mx::float32 || stream.device != mx::Device::cpu) return fallback(x);
  // The kernel walks memory in order: give it a row-contiguous input (a no-op, sharing the
  // buffer, when the evaluated input already is one).
  return mx::array(x.shape(), mx::float32, std::make_shared<CpuElementwise>(stream, kernel, name), {mx::contiguous(x)});
}

// ---- The transformer block's kernels ------------------------------------------------------
//
// On the CPU MLX runs each elementwise op as its own single-threaded pass, and its RMS norm is
// a composition of five of them. A Z-Image block's work between its products (norms, qk-norm,
// RoPE, the head transposes, softmax, SiLU gate, residual adds) thus cost about as much as the
// products at dim 512. These kernels do each stretch in one pass over memory, on every core.


// RMS norm over the last axis of a float32 [rows, n] array times a weight [n], plus a residual
// [rows, n] when there is a third input.
class CpuRmsNorm : public CpuOnlyPrimitive {
 public:
  CpuRmsNorm(mx::Stream stream, float eps) : CpuOnlyPrimitive(stream, "CpuRmsNorm"), eps_(eps) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    auto& encoder = begin(inputs, out);
    const size_t n = inputs[0].shape(-1), rows = n == 0 ? 0 : inputs[0].size() / n;
    encoder.dispatch([inputs, dst = out.data<float>(), n, rows, eps = eps_]() {
      const float* x = inputs[0].data<float>();
      const float* w = inputs[1].data<float>();
      const float* residual = inputs.size() > 2 ? inputs[2].data<float>() : nullptr;
      parallel_for(rows, n * 4, [&](size_t r0, size_t r1, size_t) {
        for (size_t r = r0; r < r1; ++r) {
          norm_row(x + r * n, w, inverse_rms(x + r * n, n, eps), residual ? residual + r * n : nullptr, dst + r * n,
                   n);
        }
      });
    });
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto o = dynamic_cast<const CpuRmsNorm*>(&other);
    return o != nullptr && o->eps_ == eps_;
  }

 private:
  float eps_;
};

MLXS_VECTOR_CLONES void silu_gate_row(const float* __restrict a, const float* __restrict b, float* __restrict y,
                                      size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = silu_one(a[i]) * b[i];
}

// [M, 2F] → [M, F]: SiLU of the first half of each row times its second half.
class CpuSiluGate : public CpuOnlyPrimitive {
 public:
  explicit CpuSiluGate(mx::Stream stream) : CpuOnlyPrimitive(stream, "CpuSiluGate") {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const mx::array& x = inputs[0];
    auto& encoder = begin(inputs, out);
    const size_t f = out.shape(-1), rows = f == 0 ? 0 : out.size() / f;
    encoder.dispatch([x, src = x.data<float>(), dst = out.data<float>(), f, rows]() {
      parallel_for(rows, f * 4, [&](size_t r0, size_t r1, size_t) {
        for (size_t r = r0; r < r1; ++r) silu_gate_row(src + r * 2 * f, src + r * 2 * f + f, dst + r * f, f);
      });
    });
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const CpuSiluGate*>(&other) != nullptr;
  }
};

}  // namespace

namespace mlxs {

mx::array silu(const mx::array& x) {
  // A narrower float computes in float32 and rounds once, as torch's SiLU does, rather than
  // rounding the sigmoid and then the product.
  if (mx::issubdtype(x.dtype(), mx::floating) && x.dtype() != mx::float32 && x.dtype() != mx::float64) {
    return mx::astype(silu(mx::astype(x, mx::float32)), x.dtype());
  }
  return elementwise(x, silu_f32, "CpuSilu", [](const mx::array& a) { return mx::multiply(a, mx::sigmoid(a)); });
}

mx::array gelu_tanh(const mx::array& x) {
  if (mx::issubdtype(x.dtype(), mx::floating) && x.dtype() != mx::float32 && x.dtype() != mx::float64) {
    return mx::astype(gelu_tanh(mx::astype(x, mx::float32)), x.dtype());
  }
  return elementwise(x, gelu_tanh_f32, "CpuGeluTanh", [](const mx::array& a) {
    auto k = mx::array(0.7978845608028654f, a.dtype());
    auto cubic = mx::add(a, mx::multiply(mx::array(0.044715f, a.dtype()), mx::multiply(mx::square(a), a)));
    auto half = mx::multiply(mx::array(0.5f, a.dtype()), a);
    return mx::multiply(half, mx::add(mx::array(1.0f, a.dtype()), mx::tanh(mx::multiply(k, cubic))));
  });
}

mx::array group_norm(const mx::array& x, const mx::array& weight, const mx::array& bias, int groups, float eps,
                     bool silu) {
  if (x.ndim() < 2 || groups <= 0 || x.shape(-1) % groups != 0) {
    throw std::invalid_argument("[group_norm] the last axis (channels) must be a positive multiple of the groups");
  }
  int batch = x.shape(0), c = x.shape(-1);
  if (weight.size() != static_cast<size_t>(c) || bias.size() != static_cast<size_t>(c)) {
    throw std::invalid_argument("[group_norm] weight and bias need one value per channel (" + std::to_string(c) + ")");
  }
  auto stream = mx::default_stream(mx::default_device());
  if (x.dtype() == mx::float32 && weight.dtype() == mx::float32 && bias.dtype() == mx::float32 &&
      stream.device == mx::Device::cpu) {
    auto w = mx::contiguous(mx::reshape(weight, {c}));
    auto b = mx::contiguous(mx::reshape(bias, {c}));
    return mx::array(x.shape(), mx::float32, std::make_shared<CpuGroupNorm>(stream, groups, eps, silu),
                     {mx::contiguous(x), w, b});
  }
  // Elsewhere the same statistics from MLX's ops, in f32: per-channel means over the pixels,
  // averaged over each group's channels (exact, since a group's channels cover the same pixels).
  int per_group = c / groups;
  auto x32 = mx::reshape(mx::astype(x, mx::float32), {batch, -1, c});
  auto group_mean = [&](const mx::array& per_channel) {
    auto m = mx::mean(mx::reshape(per_channel, {batch, 1, groups, per_group}), 3, true);
    return mx::reshape(mx::broadcast_to(m, {batch, 1, groups, per_group}), {batch, 1, c});
  };
  auto mean = group_mean(mx::mean(x32, 1, true));
  auto var = group_mean(mx::mean(mx::square(mx::subtract(x32, mean)), 1, true));
  auto scale = mx::multiply(mx::rsqrt(mx::add(var, mx::array(eps))), mx::astype(weight, mx::float32));
  auto shift = mx::subtract(mx::astype(bias, mx::float32), mx::multiply(mean, scale));
  auto y = mx::add(mx::multiply(x32, scale), shift);
  y = mx::astype(mx::reshape(y, x.shape()), x.dtype());
  return silu ? mlxs::silu(y) : y;
}

mx::array rms_norm(const mx::array& x, const mx::array& weight, float eps, const std::optional<mx::array>& residual) {
  const int n = x.ndim() == 0 ? 0 : x.shape(-1);
  if (x.ndim() == 0 || weight.size() != static_cast<size_t>(n) || (residual && residual->shape() != x.shape())) {
    throw std::invalid_argument("[rms_norm] expects x [..., N], a weight of N values and a residual shaped as x");
  }
  auto stream = mx::default_stream(mx::default_device());
  if (cpu_float32(stream, {&x, &weight}) && (!residual || residual->dtype() == mx::float32)) {
    std::vector<mx::array> inputs{mx::contiguous(x), mx::contiguous(mx::reshape(weight, {n}))};
    if (residual) inputs.push_back(mx::contiguous(*residual));
    return mx::array(x.shape(), mx::float32, std::make_shared<CpuRmsNorm>(stream, eps), std::move(inputs));
  }
  auto y = mx::fast::rms_norm(x, mx::reshape(weight, {n}), eps);
  return residual ? mx::add(*residual, y) : y;
}

mx::array silu_gate(const mx::array& x) {
  if (x.ndim() == 0 || x.shape(-1) % 2 != 0) throw std::invalid_argument("[silu_gate] expects [..., 2F]");
  auto out_shape = x.shape();
  out_shape.back() /= 2;
  auto stream = mx::default_stream(mx::default_device());
  if (cpu_float32(stream, {&x})) {
    return mx::array(out_shape, mx::float32, std::make_shared<CpuSiluGate>(stream), {mx::contiguous(x)});
  }
  auto halves = mx::split(x, 2, -1);
  return mx::multiply(silu(halves[0]), halves[1]);
}

}  // namespace mlxs
