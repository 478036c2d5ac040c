#include "cpu_kernels.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

namespace {

// e^x for x in [-87, 88], as 2^k · e^r with |r| ≤ ln2/2 and e^r from its Taylor series to r^7
// (relative error below 1e-8, under one float ulp). Plain arithmetic and bit casts only, so
// that the compiler vectorises the loop that calls it.
__attribute__((always_inline)) inline float exp_bounded(float x) {
  const float log2e = 1.44269504088896341f;
  const float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
  const float round_magic = 12582912.0f;  // 1.5 · 2^23: adding it rounds to an integer
  float t = x * log2e + round_magic;
  float k = t - round_magic;
  int32_t ki;
  std::memcpy(&ki, &t, sizeof ki);
  ki -= 0x4B400000;  // the bits of round_magic: what is left is k
  float r = (x - k * ln2_hi) - k * ln2_lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t scale_bits = (ki + 127) << 23;
  float scale;
  std::memcpy(&scale, &scale_bits, sizeof scale);
  return p * scale;
}

// On x86-64 the baseline is SSE2; a clone for AVX2 with FMA (x86-64-v3), picked at load time
// by the CPU's features, runs about 8× faster.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define MLXS_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define MLXS_VECTOR_CLONES
#endif

MLXS_VECTOR_CLONES void silu_f32(const float* __restrict x, float* __restrict y, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float v = x[i];
    // Beyond ±87 the clamped exponent still gives x (large x) or a value that rounds to the
    // true one's underflow (very negative x).
    float c = v < -87.0f ? -87.0f : v;
    c = c > 87.0f ? 87.0f : c;
    y[i] = v / (1.0f + exp_bounded(-c));
  }
}

// e^x on [-87, 88]; above that infinity, below it zero (the subnormal range is flushed). Its
// user, softmax, only passes values ≤ 0.
MLXS_VECTOR_CLONES void exp_f32(const float* __restrict x, float* __restrict y, size_t n) {
  const float inf = __builtin_inff();
  for (size_t i = 0; i < n; ++i) {
    float v = x[i];
    float c = v < -87.0f ? -87.0f : v;
    c = c > 88.0f ? 88.0f : c;
    float e = exp_bounded(c);
    e = v > 88.0f ? inf : e;
    e = v < -87.0f ? 0.0f : e;
    y[i] = e;
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
      for (size_t j = 0; j < c; ++j) {
        float v = in[j] * scale[j] + shift[j];
        float cl = v < -87.0f ? -87.0f : v;
        cl = cl > 87.0f ? 87.0f : cl;
        o[j] = v / (1.0f + exp_bounded(-cl));
      }
    } else {
      for (size_t j = 0; j < c; ++j) o[j] = in[j] * scale[j] + shift[j];
    }
  }
}

// GroupNorm (PyTorch's grouping: consecutive channels) over [B, H, W, C] float32, optionally
// followed by SiLU, as one MLX primitive: three passes over memory where the composed ops take ten.
class CpuGroupNorm : public mx::UnaryPrimitive {
 public:
  CpuGroupNorm(mx::Stream stream, int groups, float eps, bool silu)
      : mx::UnaryPrimitive(stream), groups_(groups), eps_(eps), silu_(silu) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const mx::array& x = inputs[0];
    const mx::array& weight = inputs[1];
    const mx::array& bias = inputs[2];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (auto& a : inputs) encoder.set_input_array(a);
    encoder.set_output_array(out);
    size_t batch = x.shape(0), c = x.shape(-1), rows = x.size() / (batch * c);
    encoder.dispatch([x, weight, bias, src = x.data<float>(), dst = out.data<float>(), w = weight.data<float>(),
                      b = bias.data<float>(), batch, rows, c, groups = static_cast<size_t>(groups_), eps = eps_,
                      silu = silu_]() {
      std::vector<double> sums(c);
      std::vector<float> block(c), centre(c), scale(c), shift(c);
      size_t per_group = c / groups;
      double count = static_cast<double>(rows) * per_group;
      for (size_t n = 0; n < batch; ++n) {
        const float* xin = src + n * rows * c;
        // Group means, broadcast back to every channel of the group.
        channel_sums(xin, rows, c, nullptr, block.data(), sums.data());
        for (size_t g = 0; g < groups; ++g) {
          double s = 0.0;
          for (size_t j = g * per_group; j < (g + 1) * per_group; ++j) s += sums[j];
          for (size_t j = g * per_group; j < (g + 1) * per_group; ++j) centre[j] = static_cast<float>(s / count);
        }
        channel_sums(xin, rows, c, centre.data(), block.data(), sums.data());
        for (size_t g = 0; g < groups; ++g) {
          double s = 0.0;
          for (size_t j = g * per_group; j < (g + 1) * per_group; ++j) s += sums[j];
          float inv_std = static_cast<float>(1.0 / std::sqrt(s / count + eps));
          for (size_t j = g * per_group; j < (g + 1) * per_group; ++j) {
            scale[j] = w[j] * inv_std;
            shift[j] = b[j] - centre[j] * scale[j];
          }
        }
        scale_shift(xin, dst + n * rows * c, rows, c, scale.data(), shift.data(), silu);
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("[CpuGroupNorm] the CPU kernel has no GPU version");
  }

  const char* name() const override { return "CpuGroupNorm"; }

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
class CpuElementwise : public mx::UnaryPrimitive {
 public:
  CpuElementwise(mx::Stream stream, Kernel kernel, const char* name)
      : mx::UnaryPrimitive(stream), kernel_(kernel), name_(name) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const mx::array& x = inputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_input_array(x);
    encoder.set_output_array(out);
    encoder.dispatch([x, kernel = kernel_, src = x.data<float>(), dst = out.data<float>(), n = x.size()]() {
      kernel(src, dst, n);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error(std::string("[") + name_ + "] the CPU kernel has no GPU version");
  }

  const char* name() const override { return name_; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto o = dynamic_cast<const CpuElementwise*>(&other);
    return o != nullptr && o->kernel_ == kernel_;
  }

 private:
  Kernel kernel_;
  const char* name_;
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

mx::array exp(const mx::array& x) {
  return elementwise(x, exp_f32, "CpuExp", [](const mx::array& a) { return mx::exp(a); });
}

mx::array attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale, bool causal) {
  auto stream = mx::default_stream(mx::default_device());
  auto dtype = q.dtype();
  bool floats = mx::issubdtype(dtype, mx::floating) && dtype != mx::float64 && k.dtype() == dtype && v.dtype() == dtype;
  if (!floats || stream.device != mx::Device::cpu || q.ndim() != 4 || q.shape(1) % k.shape(1) != 0 ||
      (causal && q.shape(2) > k.shape(2))) {
    return mx::fast::scaled_dot_product_attention(q, k, v, scale, causal ? "causal" : "", std::nullopt);
  }
  bool narrow = dtype != mx::float32;
  int batch = q.shape(0), heads = q.shape(1), kv_heads = k.shape(1), len = q.shape(2), keys = k.shape(2);
  int group = heads / kv_heads, dim = q.shape(3);
  // Query heads of one kv head side by side, [B, kvH, group, L, D], so that one product per kv
  // head serves its whole group.
  auto q5 = mx::reshape(q, {batch, kv_heads, group, len, dim});
  auto k5 = mx::expand_dims(k, 2);
  auto v5 = mx::expand_dims(v, 2);
  if (narrow) {
    q5 = mx::astype(q5, mx::float32), k5 = mx::astype(k5, mx::float32), v5 = mx::astype(v5, mx::float32);
  }
  std::optional<mx::array> bias;
  if (causal) {
    // Query i (aligned to the last keys, as MLX's causal mode does) sees keys j ≤ i + keys − len.
    auto rows = mx::reshape(mx::arange(keys - len, keys, mx::int32), {len, 1});
    auto cols = mx::reshape(mx::arange(0, keys, mx::int32), {1, keys});
    bias = mx::where(mx::less_equal(cols, rows), mx::array(0.0f), mx::array(-std::numeric_limits<float>::infinity()));
  }
  // kv heads in chunks, so that a chunk's scores stay under 256 MiB.
  int64_t per_kv_head = int64_t{batch} * group * len * keys * 4;
  int chunk = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(kv_heads, (int64_t{256} << 20) / per_kv_head)));
  std::vector<mx::array> outs;
  for (int h0 = 0; h0 < kv_heads; h0 += chunk) {
    int h1 = std::min(kv_heads, h0 + chunk);
    auto pick = [&](const mx::array& a) {
      return mx::slice(a, {0, h0, 0, 0, 0}, {a.shape(0), h1, a.shape(2), a.shape(3), a.shape(4)});
    };
    // f32 scales the query ([.., L, D]) rather than the scores ([.., L, S]): one pass less. A
    // narrower dtype scales the f32 scores, as torch's CPU kernel does.
    auto scores = narrow ? mx::multiply(mx::matmul(pick(q5), mx::swapaxes(pick(k5), -1, -2)), mx::array(scale))
                         : mx::matmul(mx::multiply(pick(q5), mx::array(scale)), mx::swapaxes(pick(k5), -1, -2));
    if (bias) scores = mx::add(scores, *bias);
    auto e = mlxs::exp(mx::subtract(scores, mx::max(scores, -1, true)));
    auto sum = mx::sum(e, -1, true);
    // torch's CPU kernel rounds the unnormalised weights to the input dtype before the product
    // with v, which it accumulates in f32; the normalised output is rounded once.
    auto weights = narrow ? mx::astype(mx::astype(e, dtype), mx::float32) : e;
    // Normalising the [.., L, D] output costs less than normalising the [.., L, S] weights.
    outs.push_back(mx::divide(mx::matmul(weights, pick(v5)), sum));
  }
  auto o = outs.size() == 1 ? outs[0] : mx::concatenate(outs, 1);
  o = mx::reshape(o, {batch, heads, len, dim});
  return narrow ? mx::astype(o, dtype) : o;
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

}  // namespace mlxs
