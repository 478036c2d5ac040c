#include "cpu_kernels.h"

#include <dlfcn.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#ifdef __linux__
#include <sched.h>
#endif

// Beyond mlx/mlx.h: the kernels are MLX primitives, so that they stay lazy and join graphs like
// any other op, and the public API has no way to define one. primitives.h (the Primitive and
// UnaryPrimitive bases) and backend/cpu/encoder.h (the CPU stream's command encoder, which runs
// a kernel in order with MLX's own) are the headers MLX's custom-extension guide builds on; they
// ship in every MLX install but are not a stable API, so a new MLX may need these classes
// updated. allocator.h is public (mlx.h reaches it through array.h) and named here because the
// kernels allocate their outputs with it.
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "shim.h"

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
// by the CPU's features, runs about 8× faster, and one for AVX-512 (x86-64-v4) took another 13%
// off the transformer's norm, qk-norm and SiLU-gate kernels (`cargo bench --bench pipeline`).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define MLXS_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MLXS_VECTOR_CLONES
#endif

// The cores this process may run on (the affinity mask, not the machine's count, so that a
// container limited to 2 CPUs gets 2 workers), at most 8.
size_t worker_count() {
  static const size_t n = [] {
    size_t count = std::thread::hardware_concurrency();
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) count = CPU_COUNT(&set);
#endif
    return std::max<size_t>(1, std::min<size_t>(count, 8));
  }();
  return n;
}

// f(begin, end, worker) over [0, items) split evenly across the workers; inline when the work
// (items × cost) is too small to pay for starting threads. MLX runs its CPU ops on one thread,
// so the other cores are free while a kernel runs.
template <typename F>
void parallel_for(size_t items, size_t cost, F f) {
  size_t workers = std::min(worker_count(), items);
  if (workers <= 1 || items * cost < (size_t{1} << 22)) {
    f(size_t{0}, items, size_t{0});
    return;
  }
  auto range = [&](size_t t) { return std::pair{items * t / workers, items * (t + 1) / workers}; };
  std::vector<std::thread> threads;
  size_t started = 1;
  for (; started < workers; ++started) {
    // This runs on MLX's stream thread, where an exception would end the process: a thread
    // that cannot be started leaves its share to this one.
    try {
      auto [b, e] = range(started);
      threads.emplace_back(f, b, e, started);
    } catch (const std::system_error&) {
      break;
    }
  }
  for (size_t t = 0; t < workers; ++t) {
    if (t == 0 || t >= started) {
      auto [b, e] = range(t);
      f(b, e, t);
    }
  }
  for (auto& t : threads) t.join();
}

// x · sigmoid(x). Beyond ±87 the clamped exponent still gives x (large x) or a value that
// rounds to the true one's underflow (very negative x).
__attribute__((always_inline)) inline float silu_one(float v) {
  float c = v < -87.0f ? -87.0f : v;
  c = c > 87.0f ? 87.0f : c;
  return v / (1.0f + exp_bounded(-c));
}

MLXS_VECTOR_CLONES void silu_f32(const float* __restrict x, float* __restrict y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = silu_one(x[i]);
}

// The row's maximum, in 8 lanes; 0 for a fully masked row (all −inf), whose weights are all 0.
MLXS_VECTOR_CLONES float row_max(const float* x, size_t n) {
  constexpr size_t kLanes = 8;
  float lane[kLanes];
  for (size_t l = 0; l < kLanes; ++l) lane[l] = -__builtin_inff();
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (size_t l = 0; l < kLanes; ++l) lane[l] = x[i + l] > lane[l] ? x[i + l] : lane[l];
  float m = -__builtin_inff();
  for (size_t l = 0; l < kLanes; ++l) m = lane[l] > m ? lane[l] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m == -__builtin_inff() ? 0.0f : m;
}

// e = exp(x − m), summed in 8 lanes; `e` may be `x` itself. What lies more than 87 below m
// weighs 0 (−inf for a masked score).
MLXS_VECTOR_CLONES float exp_shifted(const float* x, float* e, size_t n, float m) {
  constexpr size_t kLanes = 8;
  float lane[kLanes] = {};
  auto one = [m](float v) {
    float d = v - m;
    float y = exp_bounded(d < -87.0f ? -87.0f : d);
    return d < -87.0f ? 0.0f : y;
  };
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (size_t l = 0; l < kLanes; ++l) {
      float y = one(x[i + l]);
      e[i + l] = y;
      lane[l] += y;
    }
  float total = 0.0f;
  for (size_t l = 0; l < kLanes; ++l) total += lane[l];
  for (; i < n; ++i) {
    float y = one(x[i]);
    e[i] = y;
    total += y;
  }
  return total;
}

// Softmax's numerator and denominator for each row of `x`: e = exp(x − max(row)) and
// sum(e). One read of the row for the max and one for the exponentials, while it is in cache.
void softmax_row_parts(const float* x, float* e, size_t n, float* sum) { *sum = exp_shifted(x, e, n, row_max(x, n)); }

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

// A primitive with a CPU kernel only. The ops that make one put it on a CPU stream, so a GPU
// evaluation is a caller's mistake and says so, naming the kernel.
class CpuOnlyPrimitive : public mx::UnaryPrimitive {
 public:
  CpuOnlyPrimitive(mx::Stream stream, const char* name) : mx::UnaryPrimitive(stream), name_(name) {}

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error(std::string("[") + name_ + "] the CPU kernel has no GPU version");
  }

  const char* name() const override { return name_; }

 protected:
  // Allocates `out` and registers the inputs and `out` with the stream's encoder, which it
  // returns for the work to be dispatched on.
  mx::cpu::CommandEncoder& begin(const std::vector<mx::array>& inputs, mx::array& out) {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (auto& a : inputs) encoder.set_input_array(a);
    encoder.set_output_array(out);
    return encoder;
  }

 private:
  const char* name_;
};

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

// softmax_row_parts over every row of a float32 array, as an MLX primitive with two outputs:
// the exponentials (the input's shape) and the row sums (last axis 1).
class CpuSoftmaxParts : public mx::Primitive {
 public:
  explicit CpuSoftmaxParts(mx::Stream stream) : mx::Primitive(stream) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array& x = inputs[0];
    for (auto& o : outputs) o.set_data(mx::allocator::malloc(o.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_input_array(x);
    for (auto& o : outputs) encoder.set_output_array(o);
    size_t n = x.shape(-1), rows = n == 0 ? 0 : x.size() / n;
    encoder.dispatch([x, src = x.data<float>(), e = outputs[0].data<float>(), sums = outputs[1].data<float>(), rows,
                      n]() {
      parallel_for(rows, n, [&](size_t r0, size_t r1, size_t) {
        for (size_t r = r0; r < r1; ++r) softmax_row_parts(src + r * n, e + r * n, n, sums + r);
      });
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("[CpuSoftmaxParts] the CPU kernel has no GPU version");
  }

  const char* name() const override { return "CpuSoftmaxParts"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const CpuSoftmaxParts*>(&other) != nullptr;
  }
};

// CBLAS row-major sgemm, as MLX's own CPU matmuls call it.
using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
constexpr int kRowMajor = 101, kNoTrans = 111;

// The sgemm of the BLAS that MLX links, looked up once; null where there is none, and the
// kernels that need it then take MLX's ops.
Sgemm blas_sgemm() {
  static const auto sgemm = reinterpret_cast<Sgemm>(mlxs_sgemm_symbol());
  return sgemm;
}

// A stride-1 "same" convolution of NHWC float32 by a kernel other than 3×3 (those take the
// Winograd form below) as matrix products: for a block of output
// pixels, their k×k input patches are gathered into rows ("im2col", zeros beyond the border)
// and multiplied by the [k·k·I, O] weight matrix in one sgemm with K = k·k·I, accumulating onto
// the bias. Each output is written once, where one product per tap reads and writes it k²
// times. Blocks of gathered rows of at most kPatchBytes stay in the last-level cache between
// the gather and the product (4–8 MiB measured best, 32 MiB 5% slower on a 32 MiB L3).
constexpr size_t kPatchBytes = size_t{8} << 20;

// The gather buffer of the convolutions queued on `stream`, at least `floats` long. Taken in
// eval, where a failed allocation can still be reported, and shared by every convolution of the
// stream: a stream runs its tasks one at a time, so they never use it at once, and reusing it
// spares each call a page fault per 4 KiB. A larger request replaces it; tasks already queued
// keep the old one alive.
std::shared_ptr<std::vector<float>> patch_scratch(const mx::Stream& stream, size_t floats) {
  static std::mutex mutex;
  static std::unordered_map<int, std::shared_ptr<std::vector<float>>> by_stream;
  std::lock_guard<std::mutex> lock(mutex);
  auto& buffer = by_stream[stream.index];
  if (!buffer || buffer->size() < floats) buffer = std::make_shared<std::vector<float>>(floats);
  return buffer;
}

class CpuConv2d : public CpuOnlyPrimitive {
 public:
  CpuConv2d(mx::Stream stream, int k, Sgemm sgemm) : CpuOnlyPrimitive(stream, "CpuConv2d"), k_(k), sgemm_(sgemm) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const mx::array& x = inputs[0];
    const mx::array& w = inputs[1];
    const mx::array& bias = inputs[2];
    auto& encoder = begin(inputs, out);
    const int pixels = x.shape(1) * x.shape(2), depth = k_ * k_ * x.shape(3);
    const int block = k_ == 1 ? pixels : std::max(64, static_cast<int>(kPatchBytes / (sizeof(float) * depth)));
    auto scratch = patch_scratch(stream(), k_ == 1 ? 0 : static_cast<size_t>(std::min(block, pixels)) * depth);
    encoder.dispatch([x, w, bias, src = x.data<float>(), wt = w.data<float>(), b = bias.data<float>(),
                      dst = out.data<float>(), batch = x.shape(0), h = x.shape(1), wd = x.shape(2), cin = x.shape(3),
                      cout = out.shape(3), k = k_, sgemm = sgemm_, pixels, depth, block, scratch]() {
      const int pad = k / 2;
      float* patches = scratch->data();
      for (int n = 0; n < batch; ++n) {
        const float* image = src + static_cast<size_t>(n) * pixels * cin;
        float* result = dst + static_cast<size_t>(n) * pixels * cout;
        for (int p0 = 0; p0 < pixels; p0 += block) {
          const int m = std::min(block, pixels - p0);
          const float* a = image + static_cast<size_t>(p0) * cin;
          if (k > 1) {
            for (int r = 0; r < m; ++r) {
              const int i = (p0 + r) / wd, j = (p0 + r) % wd;
              float* row = patches + static_cast<size_t>(r) * depth;
              for (int dy = 0; dy < k; ++dy) {
                const int y = i + dy - pad;
                float* taps = row + static_cast<size_t>(dy) * k * cin;
                if (y < 0 || y >= h) {
                  std::memset(taps, 0, sizeof(float) * k * cin);
                  continue;
                }
                // The row's k taps are k neighbouring pixels: one copy, less what lies off the edge.
                const int x0 = j - pad, lo = std::max(0, -x0), hi = std::min(k, wd - x0);
                if (lo > 0) std::memset(taps, 0, sizeof(float) * lo * cin);
                std::memcpy(taps + static_cast<size_t>(lo) * cin,
                            image + (static_cast<size_t>(y) * wd + x0 + lo) * cin, sizeof(float) * (hi - lo) * cin);
                if (hi < k) std::memset(taps + static_cast<size_t>(hi) * cin, 0, sizeof(float) * (k - hi) * cin);
              }
            }
            a = patches;
          }
          float* c = result + static_cast<size_t>(p0) * cout;
          for (int r = 0; r < m; ++r) std::memcpy(c + static_cast<size_t>(r) * cout, b, sizeof(float) * cout);
          sgemm(kRowMajor, kNoTrans, kNoTrans, m, cout, depth, 1.0f, a, depth, wt, cout, 1.0f, c, cout);
        }
      }
    });
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto o = dynamic_cast<const CpuConv2d*>(&other);
    return o != nullptr && o->k_ == k_;
  }

 private:
  int k_;
  Sgemm sgemm_;
};

// ---- 3×3 convolutions by Winograd's minimal filtering, F(2×2, 3×3) ---------------------------
//
// Each 2×2 block of outputs ("tile") comes from its 4×4 input patch d and the 3×3 filter g as
//   Y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A          (Lavin & Gray, "Fast Algorithms for CNNs", 2016)
// with Bᵀ = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; ½ ½ ½; ½ -½ ½; 0 0 1] and
// Aᵀ = [1 1 1 0; 0 1 -1 -1]. Summed over the input channels, each of the 16 element-wise
// products is one matrix product [tiles × I]·[I × O], run by the BLAS: 16 multiplications per
// tile and channel pair where the direct form takes 36 (2.25× fewer), and the transformed input
// is 4× the input where gathered 3×3 patches are 9×. The transforms' constants are 0, ±1 and ±½,
// so the error stays that of a few more additions per output.
constexpr size_t kWinogradChunk = 64;

// G g Gᵀ for input channel `i` and every output channel: g[dy][dx] is row (dy·3 + dx)·I + i of
// the [9·I, O] weight matrix `w`; the 16 results go to u[ξ][i][·] of u [16, I, O].
MLXS_VECTOR_CLONES void winograd_weight_row(const float* __restrict w, size_t cin, size_t cout, size_t i,
                                            float* __restrict u) {
  for (size_t o0 = 0; o0 < cout; o0 += kWinogradChunk) {
    const size_t n = std::min(kWinogradChunk, cout - o0);
    float t[4][3][kWinogradChunk];  // G g
    for (size_t dx = 0; dx < 3; ++dx) {
      const float* g0 = w + ((0 * 3 + dx) * cin + i) * cout + o0;
      const float* g1 = w + ((1 * 3 + dx) * cin + i) * cout + o0;
      const float* g2 = w + ((2 * 3 + dx) * cin + i) * cout + o0;
      for (size_t c = 0; c < n; ++c) {
        t[0][dx][c] = g0[c];
        t[1][dx][c] = 0.5f * (g0[c] + g1[c] + g2[c]);
        t[2][dx][c] = 0.5f * (g0[c] - g1[c] + g2[c]);
        t[3][dx][c] = g2[c];
      }
    }
    float out[16][kWinogradChunk];  // (G g) Gᵀ
    for (size_t r = 0; r < 4; ++r) {
      for (size_t c = 0; c < n; ++c) {
        out[r * 4 + 0][c] = t[r][0][c];
        out[r * 4 + 1][c] = 0.5f * (t[r][0][c] + t[r][1][c] + t[r][2][c]);
        out[r * 4 + 2][c] = 0.5f * (t[r][0][c] - t[r][1][c] + t[r][2][c]);
        out[r * 4 + 3][c] = t[r][2][c];
      }
    }
    for (size_t x = 0; x < 16; ++x) std::memcpy(u + (x * cin + i) * cout + o0, out[x], sizeof(float) * n);
  }
}

// Bᵀ d B of one tile for channels [c0, c0 + n), n ≤ kWinogradChunk: d[r][c] points at the
// tile's input pixel (row r, column c), or at zeros beyond the image; result ξ goes to
// v + ξ·stride + c0.
MLXS_VECTOR_CLONES void winograd_input_tile(const float* const (&d)[4][4], size_t c0, size_t n, float* __restrict v,
                                            size_t stride) {
  float u[4][4][kWinogradChunk];  // Bᵀ d
  for (size_t j = 0; j < 4; ++j) {
    const float *r0 = d[0][j] + c0, *r1 = d[1][j] + c0, *r2 = d[2][j] + c0, *r3 = d[3][j] + c0;
    for (size_t c = 0; c < n; ++c) {
      u[0][j][c] = r0[c] - r2[c];
      u[1][j][c] = r1[c] + r2[c];
      u[2][j][c] = r2[c] - r1[c];
      u[3][j][c] = r1[c] - r3[c];
    }
  }
  float out[16][kWinogradChunk];  // (Bᵀ d) B
  for (size_t r = 0; r < 4; ++r) {
    for (size_t c = 0; c < n; ++c) {
      out[r * 4 + 0][c] = u[r][0][c] - u[r][2][c];
      out[r * 4 + 1][c] = u[r][1][c] + u[r][2][c];
      out[r * 4 + 2][c] = u[r][2][c] - u[r][1][c];
      out[r * 4 + 3][c] = u[r][1][c] - u[r][3][c];
    }
  }
  for (size_t x = 0; x < 16; ++x) std::memcpy(v + x * stride + c0, out[x], sizeof(float) * n);
}

// Aᵀ m A + bias of one tile for output channels [o0, o0 + n): product ξ is at m + ξ·stride;
// y[a][b] points at the tile's output pixel (a, b), null beyond the image.
MLXS_VECTOR_CLONES void winograd_output_tile(const float* __restrict m, size_t stride, const float* __restrict bias,
                                             size_t o0, size_t n, float* const (&y)[2][2]) {
  float s[2][4][kWinogradChunk];  // Aᵀ m
  for (size_t j = 0; j < 4; ++j) {
    const float *m0 = m + (0 + j) * stride + o0, *m1 = m + (4 + j) * stride + o0;
    const float *m2 = m + (8 + j) * stride + o0, *m3 = m + (12 + j) * stride + o0;
    for (size_t c = 0; c < n; ++c) {
      s[0][j][c] = m0[c] + m1[c] + m2[c];
      s[1][j][c] = m1[c] - m2[c] - m3[c];
    }
  }
  float out[2][2][kWinogradChunk];  // (Aᵀ m) A + bias
  for (size_t a = 0; a < 2; ++a) {
    for (size_t c = 0; c < n; ++c) {
      out[a][0][c] = s[a][0][c] + s[a][1][c] + s[a][2][c] + bias[o0 + c];
      out[a][1][c] = s[a][1][c] - s[a][2][c] - s[a][3][c] + bias[o0 + c];
    }
  }
  for (size_t a = 0; a < 2; ++a)
    for (size_t b = 0; b < 2; ++b)
      if (y[a][b] != nullptr) std::memcpy(y[a][b] + o0, out[a][b], sizeof(float) * n);
}

// A stride-1 "same" 3×3 convolution of NHWC float32 by F(2×2, 3×3), taking the [9·I, O] weight
// matrix the gathered form takes and transforming it once per call (a few milliseconds for the
// widest layer, against seconds of products). Tiles go in blocks whose transformed input and
// products (16 × tiles × (I + O) floats) fit kBlockBytes, so they stay in the last-level cache
// between the transforms and the products.
class CpuWinogradConv3x3 : public CpuOnlyPrimitive {
 public:
  CpuWinogradConv3x3(mx::Stream stream, Sgemm sgemm) : CpuOnlyPrimitive(stream, "CpuWinogradConv3x3"), sgemm_(sgemm) {}

  static constexpr size_t kBlockBytes = size_t{8} << 20;

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const mx::array& x = inputs[0];
    const mx::array& w = inputs[1];
    const mx::array& bias = inputs[2];
    auto& encoder = begin(inputs, out);
    const size_t h = x.shape(1), wd = x.shape(2), cin = x.shape(3), cout = out.shape(3);
    const size_t tiles_w = (wd + 1) / 2, tiles = (h + 1) / 2 * tiles_w;
    const size_t block = std::clamp<size_t>(kBlockBytes / (sizeof(float) * 16 * (cin + cout)), 16, std::max<size_t>(tiles, 1));
    // Transformed weights, transformed input of a block, its products, and one zero pixel.
    auto scratch = patch_scratch(stream(), 16 * cin * cout + 16 * block * (cin + cout) + cin);
    encoder.dispatch([x, w, bias, src = x.data<float>(), wt = w.data<float>(), b = bias.data<float>(),
                      dst = out.data<float>(), batch = x.shape(0), h, wd, cin, cout, tiles_w, tiles, block, scratch,
                      sgemm = sgemm_]() {
      float* u = scratch->data();
      float* v = u + 16 * cin * cout;
      float* m = v + 16 * block * cin;
      float* zeros = m + 16 * block * cout;
      std::fill(zeros, zeros + cin, 0.0f);
      parallel_for(cin, 16 * cout, [&](size_t i0, size_t i1, size_t) {
        for (size_t i = i0; i < i1; ++i) winograd_weight_row(wt, cin, cout, i, u);
      });
      for (size_t n = 0; n < static_cast<size_t>(batch); ++n) {
        const float* image = src + n * h * wd * cin;
        float* result = dst + n * h * wd * cout;
        for (size_t t0 = 0; t0 < tiles; t0 += block) {
          const size_t nt = std::min(block, tiles - t0);
          // A block's transform takes about a millisecond: worth a second thread (parallel_for's
          // cost is about bytes touched).
          parallel_for(nt, 64 * cin, [&](size_t b0, size_t b1, size_t) {
            for (size_t t = b0; t < b1; ++t) {
              const size_t ty = (t0 + t) / tiles_w, tx = (t0 + t) % tiles_w;
              const float* d[4][4];
              for (size_t r = 0; r < 4; ++r) {
                for (size_t c = 0; c < 4; ++c) {
                  // Input row 2·ty + r - 1, column 2·tx + c - 1 (unsigned: -1 wraps past the end).
                  const size_t y = 2 * ty + r - 1, xx = 2 * tx + c - 1;
                  d[r][c] = y < h && xx < wd ? image + (y * wd + xx) * cin : zeros;
                }
              }
              for (size_t c0 = 0; c0 < cin; c0 += kWinogradChunk)
                winograd_input_tile(d, c0, std::min(kWinogradChunk, cin - c0), v + t * cin, block * cin);
            }
          });
          for (size_t xi = 0; xi < 16; ++xi) {
            sgemm(kRowMajor, kNoTrans, kNoTrans, static_cast<int>(nt), static_cast<int>(cout), static_cast<int>(cin),
                  1.0f, v + xi * block * cin, static_cast<int>(cin), u + xi * cin * cout, static_cast<int>(cout), 0.0f,
                  m + xi * block * cout, static_cast<int>(cout));
          }
          parallel_for(nt, 64 * cout, [&](size_t b0, size_t b1, size_t) {
            for (size_t t = b0; t < b1; ++t) {
              const size_t ty = (t0 + t) / tiles_w, tx = (t0 + t) % tiles_w;
              float* y[2][2];
              for (size_t a = 0; a < 2; ++a) {
                for (size_t c = 0; c < 2; ++c) {
                  const size_t row = 2 * ty + a, col = 2 * tx + c;
                  y[a][c] = row < h && col < wd ? result + (row * wd + col) * cout : nullptr;
                }
              }
              for (size_t o0 = 0; o0 < cout; o0 += kWinogradChunk)
                winograd_output_tile(m + t * cout, block * cout, b, o0, std::min(kWinogradChunk, cout - o0), y);
            }
          });
        }
      }
    });
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const CpuWinogradConv3x3*>(&other) != nullptr;
  }

 private:
  Sgemm sgemm_;
};


// ---- Linear layers over weights kept in their stored form ----------------------------------
//
// A weight stored in bf16/f16, or affine-quantized, is widened to float32 one tile of rows at a
// time into the stream's scratch buffer and multiplied there by one sgemm: the float32 copy of a
// large layer never exists, and the product still runs near the BLAS's rate. Tiles of 64 MiB
// (the real transformer's attention weights in one) measured 5-20% faster than 16 MiB ones, and
// 1-4 MiB ones much slower: every sgemm call packs the activations again.
constexpr size_t kWeightTileBytes = size_t{64} << 20;
constexpr int kTransposed = 112;

inline float bf16_bits_to_float(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// IEEE half → float, exact for every input (subnormals, infinities and NaNs included), in plain
// integer and float arithmetic so that loops over it vectorise.
inline float f16_bits_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp == 0) {
    // Subnormal (or zero): mant · 2^-24, exact in float.
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    std::memcpy(&bits, &v, sizeof bits);
    bits |= sign;
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Rounds a float to bfloat16 (to nearest, ties to even) and widens it back, as MLX's bfloat16
// arithmetic rounds every result.
inline float round_to_bf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  if ((bits & 0x7F800000u) != 0x7F800000u) bits += 0x7FFFu + ((bits >> 16) & 1u);
  bits &= 0xFFFF0000u;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

MLXS_VECTOR_CLONES void widen_bf16(const uint16_t* __restrict src, float* __restrict dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_float(src[i]);
}

MLXS_VECTOR_CLONES void widen_f16(const uint16_t* __restrict src, float* __restrict dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f16_bits_to_float(src[i]);
}

// One row of an affine-quantized weight: element i is (packed word i / per_word, bits at
// (i mod per_word)·bits) · scale + bias of its group. The arithmetic is that of MLX's
// dequantize in the scales' dtype: product and sum each rounded to it, so that the values are
// MLX's own, bit for bit.
// Contraction of s·q + b into one fused multiply-add would round once where MLX rounds twice.
#if defined(__clang__)
#define MLXS_NO_FMA_CONTRACTION
#elif defined(__GNUC__)
#define MLXS_NO_FMA_CONTRACTION __attribute__((optimize("fp-contract=off")))
#else
#define MLXS_NO_FMA_CONTRACTION
#endif

template <int Bits, typename Scale>
MLXS_NO_FMA_CONTRACTION MLXS_VECTOR_CLONES void dequantize_row(const uint32_t* __restrict packed, const Scale* __restrict scales,
                                       const Scale* __restrict biases, float* __restrict dst, size_t k,
                                       size_t group) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  // Packed words are little-endian on every platform we build for, so value i of a row is bits
  // (i mod per_byte)·Bits of byte i / per_byte: a plain byte loop the compiler vectorises.
  constexpr int per_byte = 8 / Bits;
  constexpr uint32_t mask = (1u << Bits) - 1u;
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(packed);
  const size_t bytes_per_group = group / per_byte;
  for (size_t g = 0; g < k / group; ++g) {
    const float s = static_cast<float>(scales[g]), b = static_cast<float>(biases[g]);
    const uint8_t* in = bytes + g * bytes_per_group;
    float* out = dst + g * group;
    for (size_t c = 0; c < bytes_per_group; ++c) {
      const uint32_t byte = in[c];
      for (int j = 0; j < per_byte; ++j) {
        const float q = static_cast<float>((byte >> (j * Bits)) & mask);
        float v;
        if constexpr (std::is_same_v<Scale, float>) {
          v = s * q + b;
        } else if constexpr (std::is_same_v<Scale, mx::bfloat16_t>) {
          v = round_to_bf16(round_to_bf16(s * q) + b);
        } else {
          v = static_cast<float>(static_cast<Scale>(static_cast<float>(static_cast<Scale>(s * q)) + b));
        }
        out[c * per_byte + j] = v;
      }
    }
  }
}

// How a linear layer's weight is kept.
struct WeightForm {
  mx::Dtype dtype;  // of the dense weight, or of the scales when quantized
  bool quantized;
  int bits;
  int group;
};

// Rows [r0, r1) of the weight as float32, into dst (row stride k).
void widen_rows(const WeightForm& form, const mx::array& w, const mx::array* scales, const mx::array* biases,
                size_t r0, size_t r1, size_t k, float* dst) {
  if (!form.quantized) {
    const uint16_t* src = w.data<uint16_t>() + r0 * k;
    if (form.dtype == mx::bfloat16) {
      widen_bf16(src, dst, (r1 - r0) * k);
    } else {
      widen_f16(src, dst, (r1 - r0) * k);
    }
    return;
  }
  const size_t words = k * form.bits / 32, groups = k / form.group;
  auto run = [&](auto scale_tag, auto bits_tag) {
    using Scale = decltype(scale_tag);
    constexpr int Bits = decltype(bits_tag)::value;
    const Scale* s = scales->data<Scale>();
    const Scale* b = biases->data<Scale>();
    for (size_t r = r0; r < r1; ++r) {
      dequantize_row<Bits, Scale>(w.data<uint32_t>() + r * words, s + r * groups, b + r * groups,
                                  dst + (r - r0) * k, k, form.group);
    }
  };
  auto by_bits = [&](auto scale_tag) {
    switch (form.bits) {
      case 2:
        return run(scale_tag, std::integral_constant<int, 2>{});
      case 4:
        return run(scale_tag, std::integral_constant<int, 4>{});
      default:
        return run(scale_tag, std::integral_constant<int, 8>{});
    }
  };
  if (form.dtype == mx::float32) {
    by_bits(float{});
  } else if (form.dtype == mx::bfloat16) {
    by_bits(mx::bfloat16_t{});
  } else {
    by_bits(mx::float16_t{});
  }
}

// y[M, N] = x[M, K] · Wᵀ (+ bias), W [N, K] in a narrow form (inputs: x, w, [scales, biases],
// [bias]), as an MLX primitive on a CPU stream.
class CpuNarrowLinear : public CpuOnlyPrimitive {
 public:
  CpuNarrowLinear(mx::Stream stream, WeightForm form, bool has_bias, Sgemm sgemm)
      : CpuOnlyPrimitive(stream, "CpuNarrowLinear"), form_(form), has_bias_(has_bias), sgemm_(sgemm) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const mx::array& x = inputs[0];
    auto& encoder = begin(inputs, out);
    const size_t m = x.shape(0), k = x.shape(1), n = out.shape(1);
    const size_t tile = std::max<size_t>(16, std::min(n, kWeightTileBytes / (sizeof(float) * std::max<size_t>(k, 1))));
    auto scratch = patch_scratch(stream(), tile * k);
    encoder.dispatch([inputs, form = form_, has_bias = has_bias_, sgemm = sgemm_, m, k, n, tile, scratch,
                      dst = out.data<float>()]() {
      const mx::array& x = inputs[0];
      const mx::array& w = inputs[1];
      const mx::array* scales = form.quantized ? &inputs[2] : nullptr;
      const mx::array* biases = form.quantized ? &inputs[3] : nullptr;
      const float* bias = has_bias ? inputs.back().data<float>() : nullptr;
      float* rows = scratch->data();
      for (size_t n0 = 0; n0 < n; n0 += tile) {
        const size_t nb = std::min(tile, n - n0);
        // Widening is cheap per value: split it over the cores from a quarter million values.
        parallel_for(nb, k * 16, [&](size_t r0, size_t r1, size_t) {
          widen_rows(form, w, scales, biases, n0 + r0, n0 + r1, k, rows + r0 * k);
        });
        if (bias) {
          for (size_t r = 0; r < m; ++r) std::memcpy(dst + r * n + n0, bias + n0, sizeof(float) * nb);
        }
        if (m > 0) {
          sgemm(kRowMajor, kNoTrans, kTransposed, static_cast<int>(m), static_cast<int>(nb), static_cast<int>(k),
                1.0f, x.data<float>(), static_cast<int>(k), rows, static_cast<int>(k), bias ? 1.0f : 0.0f, dst + n0,
                static_cast<int>(n));
        }
      }
    });
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto o = dynamic_cast<const CpuNarrowLinear*>(&other);
    return o != nullptr && o->form_.dtype == form_.dtype && o->form_.quantized == form_.quantized &&
           o->form_.bits == form_.bits && o->form_.group == form_.group && o->has_bias_ == has_bias_;
  }

 private:
  WeightForm form_;
  bool has_bias_;
  Sgemm sgemm_;
};


// ---- The transformer block's kernels ------------------------------------------------------
//
// On the CPU MLX runs each elementwise op as its own single-threaded pass, and its RMS norm is
// a composition of five of them. A Z-Image block's work between its products (norms, qk-norm,
// RoPE, the head transposes, softmax, SiLU gate, residual adds) thus cost about as much as the
// products at dim 512. These kernels do each stretch in one pass over memory, on every core.

// Σ x² of a row, in lanes the compiler keeps in vector registers.
MLXS_VECTOR_CLONES float sum_squares(const float* __restrict x, size_t n) {
  constexpr size_t kLanes = 16;
  float lane[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (size_t l = 0; l < kLanes; ++l) lane[l] += x[i + l] * x[i + l];
  float total = 0.0f;
  for (size_t l = 0; l < kLanes; ++l) total += lane[l];
  for (; i < n; ++i) total += x[i] * x[i];
  return total;
}

// y = (residual +) x · inv · w, rounding as MLX's composition does: (x · inv) · w.
MLXS_VECTOR_CLONES void norm_row(const float* __restrict x, const float* __restrict w, float inv,
                                 const float* __restrict residual, float* __restrict y, size_t n) {
  if (residual) {
    for (size_t i = 0; i < n; ++i) y[i] = residual[i] + x[i] * inv * w[i];
  } else {
    for (size_t i = 0; i < n; ++i) y[i] = x[i] * inv * w[i];
  }
}

inline float inverse_rms(const float* x, size_t n, float eps) {
  return 1.0f / std::sqrt(sum_squares(x, n) / static_cast<float>(n) + eps);
}

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

// One head's q or k: RMS-normed, rotated by RoPE's interleaved pairs, times `scale`.
MLXS_VECTOR_CLONES void norm_rope_head(const float* __restrict x, const float* __restrict w, float eps,
                                       const float* __restrict cos, const float* __restrict sin, float scale,
                                       float* __restrict y, size_t d) {
  const float inv = inverse_rms(x, d, eps);
  for (size_t j = 0; j < d / 2; ++j) {
    float a = x[2 * j] * inv * w[2 * j], b = x[2 * j + 1] * inv * w[2 * j + 1];
    y[2 * j] = (a * cos[j] - b * sin[j]) * scale;
    y[2 * j + 1] = (a * sin[j] + b * cos[j]) * scale;
  }
}

// The fused q|k|v projections [S, 3·H·D] with what qk-norm and RoPE read: the q and k norm
// weights (D values) and the angles' cos and sin ([S, D/2]).
struct QkvRows {
  const float *qkv, *wq, *wk, *cos, *sin;
  size_t heads, d;
  float eps;

  QkvRows(const std::vector<mx::array>& inputs, size_t heads, float eps)
      : qkv(inputs[0].data<float>()),
        wq(inputs[1].data<float>()),
        wk(inputs[2].data<float>()),
        cos(inputs[3].data<float>()),
        sin(inputs[4].data<float>()),
        heads(heads),
        d(inputs[0].shape(1) / (3 * heads)),
        eps(eps) {}

  const float* row(size_t r) const { return qkv + r * 3 * heads * d; }

  // Token r's q (times q_scale) and k of one head, normed and rotated, into q and k.
  void rotate(size_t r, size_t head, float q_scale, float* q, float* k) const {
    const float *c = cos + r * (d / 2), *sn = sin + r * (d / 2);
    norm_rope_head(row(r) + head * d, wq, eps, c, sn, q_scale, q, d);
    norm_rope_head(row(r) + (heads + head) * d, wk, eps, c, sn, 1.0f, k, d);
  }
};

// [S, 3·H·D] fused q|k|v projections → [3, H, S, D]: q and k RMS-normed per head and rotated by
// RoPE (cos, sin: [S, D/2]), q also scaled by the attention's scale; v moved as it is.
class CpuQkvHeads : public CpuOnlyPrimitive {
 public:
  CpuQkvHeads(mx::Stream stream, int heads, float eps, float q_scale)
      : CpuOnlyPrimitive(stream, "CpuQkvHeads"), heads_(heads), eps_(eps), q_scale_(q_scale) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    auto& encoder = begin(inputs, out);
    const size_t s = inputs[0].shape(0), h = heads_, d = inputs[0].shape(1) / (3 * h);
    encoder.dispatch([inputs, dst = out.data<float>(), s, h, d, eps = eps_, q_scale = q_scale_]() {
      const QkvRows rows(inputs, h, eps);
      parallel_for(s, 3 * h * d * 4, [&](size_t r0, size_t r1, size_t) {
        for (size_t r = r0; r < r1; ++r) {
          for (size_t head = 0; head < h; ++head) {
            const size_t at = (head * s + r) * d;
            rows.rotate(r, head, q_scale, dst + at, dst + h * s * d + at);
            std::memcpy(dst + 2 * h * s * d + at, rows.row(r) + (2 * h + head) * d, sizeof(float) * d);
          }
        }
      });
    });
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto o = dynamic_cast<const CpuQkvHeads*>(&other);
    return o != nullptr && o->heads_ == heads_ && o->eps_ == eps_ && o->q_scale_ == q_scale_;
  }

 private:
  int heads_;
  float eps_;
  float q_scale_;
};

// softmax_row_parts in place: x becomes exp(x − max(row)), and the row's sum is returned.
float softmax_row_in_place(float* x, size_t n) { return exp_shifted(x, x, n, row_max(x, n)); }

MLXS_VECTOR_CLONES void divide_row(float* __restrict y, float by, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] /= by;
}

// OpenBLAS's thread count, when the BLAS is the OpenBLAS this build links (elsewhere both are
// null). Attention's per-head products are mid-sized (K or N is the head width): split across
// the cores by OpenBLAS, each pays a hand-off between its threads. Giving each core whole heads,
// with OpenBLAS set to one thread meanwhile so that no call waits on its pool, measured 4-5%
// off the big test model's step. OpenBLAS's threaded build may be called from several threads
// at once; the count is set and restored on the stream's thread, the one that issues products.
struct BlasThreads {
  void (*set)(int) = nullptr;
  int (*get)() = nullptr;
  bool available() const { return set != nullptr && get != nullptr; }
};

const BlasThreads& blas_threads() {
  static const BlasThreads threads = [] {
    BlasThreads t;
    t.set = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "scipy_openblas_set_num_threads"));
    t.get = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "scipy_openblas_get_num_threads"));
    return t;
  }();
  return threads;
}

// Sets OpenBLAS to one thread while it lives (when the count can be set), so that each core's
// products run on that core alone (see BlasThreads).
class OneBlasThread {
 public:
  OneBlasThread() : threads_(blas_threads()), before_(threads_.available() ? threads_.get() : 0) {
    if (threads_.available()) threads_.set(1);
  }
  ~OneBlasThread() {
    if (threads_.available()) threads_.set(before_);
  }
  OneBlasThread(const OneBlasThread&) = delete;
  OneBlasThread& operator=(const OneBlasThread&) = delete;

 private:
  const BlasThreads& threads_;
  int before_;
};

// One head's attention, its query rows in blocks of `rows`: the scores q·kᵀ (q already scaled)
// into `scores` [rows, s], their softmax in place, the product with v, and each output row
// divided by its row's sum, written to `out` (row stride ldo). q, k and v are [s, d] with row
// strides ldq, ldk and ldv; `sums` holds `rows` values.
void attend_head(Sgemm sgemm, const float* q, size_t ldq, const float* k, size_t ldk, const float* v, size_t ldv,
                 size_t s, size_t d, size_t rows, float* scores, float* sums, float* out, size_t ldo) {
  const auto i = [](size_t n) { return static_cast<int>(n); };
  for (size_t r0 = 0; r0 < s; r0 += rows) {
    const size_t m = std::min(rows, s - r0);
    sgemm(kRowMajor, kNoTrans, kTransposed, i(m), i(s), i(d), 1.0f, q + r0 * ldq, i(ldq), k, i(ldk), 0.0f, scores,
          i(s));
    for (size_t r = 0; r < m; ++r) sums[r] = softmax_row_in_place(scores + r * s, s);
    sgemm(kRowMajor, kNoTrans, kNoTrans, i(m), i(d), i(s), 1.0f, scores, i(s), v, i(ldv), 0.0f, out + r0 * ldo,
          i(ldo));
    for (size_t r = 0; r < m; ++r) divide_row(out + (r0 + r) * ldo, sums[r], d);
  }
}

// Whether attention can give each core whole heads: OpenBLAS's thread count can be set, and
// there are two heads and two cores at least.
bool heads_per_core(size_t heads) { return blas_threads().available() && heads >= 2 && worker_count() >= 2; }

// Unmasked attention of [3, H, S, D] (q already scaled) → [S, H·D], the heads side by side as
// the output projection takes them. For a block of query rows: every head's scores by one sgemm
// each into the stream's scratch, the softmax of all those rows across the cores, and each
// head's product with v written straight into its columns of the output.
class CpuAttentionRows : public CpuOnlyPrimitive {
 public:
  CpuAttentionRows(mx::Stream stream, Sgemm sgemm) : CpuOnlyPrimitive(stream, "CpuAttentionRows"), sgemm_(sgemm) {}

  // Scores of at most this many bytes per block of query rows.
  static constexpr size_t kScoreBytes = size_t{32} << 20;

  static size_t block_rows(size_t h, size_t s) {
    return std::max<size_t>(8, std::min(s, kScoreBytes / (sizeof(float) * std::max<size_t>(h * s, 1))));
  }

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const mx::array& qkv = inputs[0];
    auto& encoder = begin(inputs, out);
    const size_t h = qkv.shape(1), s = qkv.shape(2), d = qkv.shape(3), rows = block_rows(h, s);
    auto scratch = patch_scratch(stream(), rows * h * (s + 1));
    encoder.dispatch([qkv, src = qkv.data<float>(), dst = out.data<float>(), h, s, d, rows, scratch, sgemm = sgemm_]() {
      const float *q = src, *k = src + h * s * d, *v = src + 2 * h * s * d;
      float* scores = scratch->data();
      float* sums = scores + rows * h * s;
      const int width = static_cast<int>(h * d);
      if (heads_per_core(h)) {
        // Heads to the cores, each with single-threaded products (see BlasThreads).
        OneBlasThread one;
        parallel_for(h, std::numeric_limits<size_t>::max() >> 8, [&](size_t b, size_t e, size_t) {
          for (size_t head = b; head < e; ++head) {
            attend_head(sgemm, q + head * s * d, d, k + head * s * d, d, v + head * s * d, d, s, d, rows,
                        scores + head * rows * s, sums + head * rows, dst + head * d, width);
          }
        });
        return;
      }
      for (size_t r0 = 0; r0 < s; r0 += rows) {
        const size_t m = std::min(rows, s - r0);
        for (size_t head = 0; head < h; ++head) {
          sgemm(kRowMajor, kNoTrans, kTransposed, static_cast<int>(m), static_cast<int>(s), static_cast<int>(d), 1.0f,
                q + (head * s + r0) * d, static_cast<int>(d), k + head * s * d, static_cast<int>(d), 0.0f,
                scores + head * rows * s, static_cast<int>(s));
        }
        parallel_for(h * m, s * 8, [&](size_t b, size_t e, size_t) {
          for (size_t i = b; i < e; ++i) {
            const size_t head = i / m, r = i % m;
            sums[head * rows + r] = softmax_row_in_place(scores + (head * rows + r) * s, s);
          }
        });
        for (size_t head = 0; head < h; ++head) {
          sgemm(kRowMajor, kNoTrans, kNoTrans, static_cast<int>(m), static_cast<int>(d), static_cast<int>(s), 1.0f,
                scores + head * rows * s, static_cast<int>(s), v + head * s * d, static_cast<int>(d), 0.0f,
                dst + r0 * width + head * d, width);
        }
        parallel_for(m, h * d * 4, [&](size_t b, size_t e, size_t) {
          for (size_t r = b; r < e; ++r)
            for (size_t head = 0; head < h; ++head) divide_row(dst + (r0 + r) * width + head * d, sums[head * rows + r], d);
        });
      }
    });
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const CpuAttentionRows*>(&other) != nullptr;
  }

 private:
  Sgemm sgemm_;
};

// Attention straight from the fused q|k|v projections [S, 3·H·D] → [S, H·D]: qkv_heads and
// attention_rows in one kernel. Each core takes whole heads; for each it norms and rotates the
// head's q and k into its own [S, D] buffers, which stay in its cache for the products, and
// reads v where it lies. No [3, H, S, D] copy of the projections is written, and the cores are
// woken once per block instead of twice.
class CpuQkvAttention : public CpuOnlyPrimitive {
 public:
  CpuQkvAttention(mx::Stream stream, int heads, float eps, float q_scale, Sgemm sgemm)
      : CpuOnlyPrimitive(stream, "CpuQkvAttention"), heads_(heads), eps_(eps), q_scale_(q_scale), sgemm_(sgemm) {}

  // One block of query rows' scores per core, all of them together within CpuAttentionRows' bound.
  static size_t rows_per_block(size_t s) { return CpuAttentionRows::block_rows(worker_count(), s); }
  // Per core: q and k of one head, a block of query rows' scores, and their sums.
  static size_t scratch_per_core(size_t s, size_t d) { return 2 * s * d + rows_per_block(s) * (s + 1); }

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    auto& encoder = begin(inputs, out);
    const size_t s = inputs[0].shape(0), h = heads_, d = inputs[0].shape(1) / (3 * h);
    auto scratch = patch_scratch(stream(), worker_count() * scratch_per_core(s, d));
    encoder.dispatch([inputs, dst = out.data<float>(), s, h, d, eps = eps_, q_scale = q_scale_, scratch,
                      sgemm = sgemm_]() {
      const QkvRows in(inputs, h, eps);
      const size_t rows = rows_per_block(s);
      OneBlasThread one;
      parallel_for(h, std::numeric_limits<size_t>::max() >> 8, [&](size_t b, size_t e, size_t t) {
        float* q = scratch->data() + t * scratch_per_core(s, d);
        float* k = q + s * d;
        float* scores = k + s * d;
        float* sums = scores + rows * s;
        for (size_t head = b; head < e; ++head) {
          for (size_t r = 0; r < s; ++r) in.rotate(r, head, q_scale, q + r * d, k + r * d);
          attend_head(sgemm, q, d, k, d, in.row(0) + (2 * h + head) * d, 3 * h * d, s, d, rows, scores, sums,
                      dst + head * d, h * d);
        }
      });
    });
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto o = dynamic_cast<const CpuQkvAttention*>(&other);
    return o != nullptr && o->heads_ == heads_ && o->eps_ == eps_ && o->q_scale_ == q_scale_;
  }

 private:
  int heads_;
  float eps_;
  float q_scale_;
  Sgemm sgemm_;
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

bool cpu_float32(const mx::Stream& stream, std::initializer_list<const mx::array*> xs) {
  if (stream.device != mx::Device::cpu) return false;
  for (auto* x : xs)
    if (x->dtype() != mx::float32) return false;
  return true;
}

// The head width D of fused q|k|v projections [S, 3·heads·D], once the projections and the
// qk-norm and RoPE inputs that go with them are checked to fit together (`op` names the caller
// in the error).
int qkv_head_width(const char* op, const mx::array& qkv, const mx::array& q_weight, const mx::array& k_weight,
                   const mx::array& cos, const mx::array& sin, int heads) {
  if (qkv.ndim() != 2 || heads <= 0 || qkv.shape(1) % (3 * heads) != 0 || (qkv.shape(1) / (3 * heads)) % 2 != 0) {
    throw std::invalid_argument("[" + std::string(op) + "] expects [S, 3·heads·D] with an even head width D");
  }
  const int s = qkv.shape(0), d = qkv.shape(1) / (3 * heads);
  if (q_weight.size() != static_cast<size_t>(d) || k_weight.size() != static_cast<size_t>(d) ||
      cos.size() != static_cast<size_t>(s) * (d / 2) || sin.size() != cos.size()) {
    throw std::invalid_argument("[" + std::string(op) + "] the norm weights need D values and cos/sin S·D/2");
  }
  return d;
}

// What QkvRows reads, laid out as it reads it: the projections and four flat vectors.
std::vector<mx::array> qkv_kernel_inputs(const mx::array& qkv, const mx::array& q_weight, const mx::array& k_weight,
                                         const mx::array& cos, const mx::array& sin) {
  auto flat = [](const mx::array& a) { return mx::contiguous(mx::reshape(a, {-1})); };
  return {mx::contiguous(qkv), flat(q_weight), flat(k_weight), flat(cos), flat(sin)};
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
    auto sum_shape = scores.shape();
    sum_shape.back() = 1;
    auto parts = mx::array::make_arrays({scores.shape(), sum_shape}, {mx::float32, mx::float32},
                                        std::make_shared<CpuSoftmaxParts>(stream), {mx::contiguous(scores)});
    auto& e = parts[0];
    auto& sum = parts[1];
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

mx::array conv2d_same(const mx::array& x, const mx::array& weight, const mx::array& bias, int k) {
  if (x.ndim() != 4 || weight.ndim() != 2 || k < 1 || k % 2 == 0 || weight.shape(0) != k * k * x.shape(3) ||
      bias.size() != static_cast<size_t>(weight.shape(1))) {
    throw std::invalid_argument("[conv2d_same] expects NHWC input, an odd k, a [k·k·I, O] weight and O biases");
  }
  int cin = x.shape(3), cout = weight.shape(1);
  auto stream = mx::default_stream(mx::default_device());
  const Sgemm sgemm = blas_sgemm();
  if (sgemm != nullptr && stream.device == mx::Device::cpu && x.dtype() == mx::float32 &&
      weight.dtype() == mx::float32 && bias.dtype() == mx::float32) {
    std::shared_ptr<mx::Primitive> primitive;
    if (k == 3) {
      primitive = std::make_shared<CpuWinogradConv3x3>(stream, sgemm);
    } else {
      primitive = std::make_shared<CpuConv2d>(stream, k, sgemm);
    }
    return mx::array({x.shape(0), x.shape(1), x.shape(2), cout}, mx::float32, std::move(primitive),
                     {mx::contiguous(x), mx::contiguous(weight), mx::contiguous(mx::reshape(bias, {cout}))});
  }
  // Elsewhere MLX's own convolution, with the weight back in its [O, k, k, I] layout.
  auto w = mx::transpose(mx::reshape(weight, {k, k, cin, cout}), {3, 0, 1, 2});
  return mx::add(mx::conv2d(x, w, {1, 1}, {k / 2, k / 2}), mx::reshape(bias, {cout}));
}


mx::array linear(const mx::array& x, const mx::array& w, const std::optional<mx::array>& scales,
                 const std::optional<mx::array>& biases, const std::optional<mx::array>& bias, int group_size,
                 int bits, const std::string& mode) {
  const bool quantized = scales.has_value();
  const bool affine = mode == "affine";
  if (x.ndim() < 1 || w.ndim() != 2) throw std::invalid_argument("[linear] expects x [..., K] and a 2-D weight");
  const int k = x.shape(-1), n = w.shape(0);
  if (quantized && affine) {
    if (!biases) throw std::invalid_argument("[linear] an affine-quantized weight needs its biases");
    if (bits <= 0 || group_size <= 0 || k % group_size != 0 || w.shape(1) * 32 != k * bits ||
        scales->shape() != mx::Shape{n, k / group_size} || biases->shape() != scales->shape()) {
      throw std::invalid_argument("[linear] the packed weight, scales and biases do not fit K = " +
                                  std::to_string(k) + " at " + std::to_string(bits) + " bits, group " +
                                  std::to_string(group_size));
    }
  } else if (!quantized && w.shape(1) != k) {
    throw std::invalid_argument("[linear] the weight has " + std::to_string(w.shape(1)) + " columns, x has " +
                                std::to_string(k));
  }
  if (bias && bias->size() != static_cast<size_t>(n)) {
    throw std::invalid_argument("[linear] the bias needs one value per output (" + std::to_string(n) + ")");
  }
  auto stream = mx::default_stream(mx::default_device());
  const Sgemm sgemm = blas_sgemm();
  auto out_shape = x.shape();
  out_shape.back() = n;
  const auto form_dtype = quantized ? scales->dtype() : w.dtype();
  const bool narrow_float = form_dtype == mx::bfloat16 || form_dtype == mx::float16;
  const bool kernel_fits = quantized ? affine && (bits == 2 || bits == 4 || bits == 8) && group_size % (32 / bits) == 0 &&
                                           (narrow_float || form_dtype == mx::float32) && w.dtype() == mx::uint32
                                     : narrow_float;
  if (sgemm != nullptr && stream.device == mx::Device::cpu && x.dtype() == mx::float32 && kernel_fits &&
      (!bias || bias->dtype() == mx::float32)) {
    std::vector<mx::array> inputs{mx::contiguous(mx::reshape(x, {-1, k})), mx::contiguous(w)};
    if (quantized) inputs.push_back(mx::contiguous(*scales)), inputs.push_back(mx::contiguous(*biases));
    if (bias) inputs.push_back(mx::contiguous(mx::reshape(*bias, {n})));
    const int rows = static_cast<int>(x.size() / std::max(k, 1));
    auto y = mx::array({rows, n}, mx::float32,
                       std::make_shared<CpuNarrowLinear>(stream, WeightForm{form_dtype, quantized, bits, group_size},
                                                         bias.has_value(), sgemm),
                       std::move(inputs));
    return mx::reshape(y, out_shape);
  }
  // Elsewhere MLX's ops: quantized_matmul for a quantized weight (a GPU kernel that never
  // expands it), else a product with the weight in x's dtype. On the CPU this expands one layer
  // at a time, as the graph reaches it.
  // Affine scales and biases take x's dtype; the float modes' scales are bytes (E8M0, E4M3).
  auto like_x = [&](const mx::array& a) { return affine ? mx::astype(a, x.dtype()) : a; };
  std::optional<mx::array> qbiases = biases ? std::optional<mx::array>(like_x(*biases)) : std::nullopt;
  mx::array y = quantized ? (stream.device == mx::Device::cpu
                                 ? mx::matmul(x, mx::transpose(mx::astype(
                                                     mx::dequantize(w, *scales, biases, group_size, bits, mode),
                                                     x.dtype())))
                                 : mx::quantized_matmul(x, w, like_x(*scales), qbiases, true, group_size, bits, mode))
                          : mx::matmul(x, mx::transpose(w.dtype() == x.dtype() ? w : mx::astype(w, x.dtype())));
  return bias ? mx::add(y, mx::astype(*bias, x.dtype())) : y;
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

mx::array qkv_heads(const mx::array& qkv, const mx::array& q_weight, const mx::array& k_weight, const mx::array& cos,
                    const mx::array& sin, int heads, float eps, float q_scale) {
  const int d = qkv_head_width("qkv_heads", qkv, q_weight, k_weight, cos, sin, heads), s = qkv.shape(0);
  auto stream = mx::default_stream(mx::default_device());
  if (cpu_float32(stream, {&qkv, &q_weight, &k_weight, &cos, &sin})) {
    return mx::array({3, heads, s, d}, mx::float32, std::make_shared<CpuQkvHeads>(stream, heads, eps, q_scale),
                     qkv_kernel_inputs(qkv, q_weight, k_weight, cos, sin));
  }
  // Elsewhere the same steps in MLX's ops.
  auto parts = mx::split(mx::reshape(qkv, {s, 3, heads, d}), 3, 1);
  auto c = mx::reshape(cos, {s, 1, d / 2}), sn = mx::reshape(sin, {s, 1, d / 2});
  auto rotate = [&](const mx::array& t, const mx::array& w, float scale) {
    auto pairs = mx::reshape(mx::fast::rms_norm(mx::reshape(t, {s, heads, d}), w, eps), {s, heads, d / 2, 2});
    auto x0 = mx::squeeze(mx::slice(pairs, {0, 0, 0, 0}, {s, heads, d / 2, 1}), 3);
    auto x1 = mx::squeeze(mx::slice(pairs, {0, 0, 0, 1}, {s, heads, d / 2, 2}), 3);
    auto y = mx::stack({mx::subtract(mx::multiply(x0, c), mx::multiply(x1, sn)),
                        mx::add(mx::multiply(x0, sn), mx::multiply(x1, c))},
                       3);
    return mx::multiply(mx::reshape(y, {s, heads, d}), mx::array(scale, y.dtype()));
  };
  auto q = rotate(parts[0], mx::reshape(q_weight, {d}), q_scale);
  auto k = rotate(parts[1], mx::reshape(k_weight, {d}), 1.0f);
  auto v = mx::reshape(parts[2], {s, heads, d});
  return mx::transpose(mx::stack({q, k, v}, 0), {0, 2, 1, 3});
}

mx::array attention_rows(const mx::array& qkv) {
  if (qkv.ndim() != 4 || qkv.shape(0) != 3) throw std::invalid_argument("[attention_rows] expects [3, H, S, D]");
  const int h = qkv.shape(1), s = qkv.shape(2), d = qkv.shape(3);
  auto stream = mx::default_stream(mx::default_device());
  const Sgemm sgemm = blas_sgemm();
  if (sgemm != nullptr && cpu_float32(stream, {&qkv})) {
    return mx::array({s, h * d}, mx::float32, std::make_shared<CpuAttentionRows>(stream, sgemm),
                     {mx::contiguous(qkv)});
  }
  auto parts = mx::split(qkv, 3, 0);
  auto o = attention(parts[0], parts[1], parts[2], 1.0f, false);
  return mx::reshape(mx::transpose(mx::squeeze(o, 0), {1, 0, 2}), {s, h * d});
}

mx::array qkv_attention(const mx::array& qkv, const mx::array& q_weight, const mx::array& k_weight,
                        const mx::array& cos, const mx::array& sin, int heads, float eps, float q_scale) {
  const int d = qkv_head_width("qkv_attention", qkv, q_weight, k_weight, cos, sin, heads), s = qkv.shape(0);
  auto stream = mx::default_stream(mx::default_device());
  const Sgemm sgemm = blas_sgemm();
  if (s == 0 || sgemm == nullptr || !heads_per_core(heads) ||
      !cpu_float32(stream, {&qkv, &q_weight, &k_weight, &cos, &sin})) {
    return attention_rows(qkv_heads(qkv, q_weight, k_weight, cos, sin, heads, eps, q_scale));
  }
  return mx::array({s, heads * d}, mx::float32, std::make_shared<CpuQkvAttention>(stream, heads, eps, q_scale, sgemm),
                   qkv_kernel_inputs(qkv, q_weight, k_weight, cos, sin));
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
