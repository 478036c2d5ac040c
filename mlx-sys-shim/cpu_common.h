// What the CPU kernel families share: the vectorising and threading helpers, the row softmax
// and RMS pieces more than one family runs, the CPU-only primitive base and the BLAS lookup.
// Internal to the shim (namespace mlxs::detail); the kernels' API is cpu_kernels.h.
#pragma once

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

// On x86-64 the baseline is SSE2; a clone for AVX2 with FMA (x86-64-v3), picked at load time
// by the CPU's features, runs about 8× faster, and one for AVX-512 (x86-64-v4) took another 13%
// off the transformer's norm, qk-norm and SiLU-gate kernels (`cargo bench --bench pipeline`).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define MLXS_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MLXS_VECTOR_CLONES
#endif

namespace mlxs::detail {

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

// The cores this process may run on (the affinity mask, not the machine's count, so that a
// container limited to 2 CPUs gets 2 workers), at most 8.
size_t worker_count();

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

// The row's maximum, in 8 lanes; 0 for a fully masked row (all −inf), whose weights are all 0.
float row_max(const float* x, size_t n);
// e = exp(x − m), summed in 8 lanes; `e` may be `x` itself. What lies more than 87 below m
// weighs 0 (−inf for a masked score).
float exp_shifted(const float* x, float* e, size_t n, float m);
// Softmax's numerator and denominator for each row of `x`: e = exp(x − max(row)) and
// sum(e). One read of the row for the max and one for the exponentials, while it is in cache.
void softmax_row_parts(const float* x, float* e, size_t n, float* sum);

// Σ x² of a row, in lanes the compiler keeps in vector registers.
float sum_squares(const float* __restrict x, size_t n);
// y = (residual +) x · inv · w, rounding as MLX's composition does: (x · inv) · w.
void norm_row(const float* __restrict x, const float* __restrict w, float inv, const float* __restrict residual,
              float* __restrict y, size_t n);
inline float inverse_rms(const float* x, size_t n, float eps) {
  return 1.0f / std::sqrt(sum_squares(x, n) / static_cast<float>(n) + eps);
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

// CBLAS row-major sgemm, as MLX's own CPU matmuls call it.
using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
constexpr int kRowMajor = 101, kNoTrans = 111;

// The sgemm of the BLAS that MLX links, looked up once; null where there is none, and the
// kernels that need it then take MLX's ops.
inline Sgemm blas_sgemm() {
  static const auto sgemm = reinterpret_cast<Sgemm>(mlxs_sgemm_symbol());
  return sgemm;
}
constexpr int kTransposed = 112;

extern "C" void* mlxs_sgemm_batch_strided_symbol(void);

// CBLAS row-major strided batch of sgemms: product i is A + i·stride_a times B + i·stride_b
// into C + i·stride_c (OpenBLAS's and MKL's argument order).
using SgemmBatchStrided = void (*)(int, int, int, int, int, int, float, const float*, int, int, const float*, int,
                                   int, float, float*, int, int, int);

// OpenBLAS's strided batch, when it is the BLAS MLX uses; null elsewhere. It spreads whole
// products over the threads, each product on one, so no thread waits on another inside a
// product: a batch of small products then runs at the rate of one large one, and a core taken
// by another process delays only its own share.
inline SgemmBatchStrided blas_sgemm_batch_strided() {
  static const auto batch = reinterpret_cast<SgemmBatchStrided>(mlxs_sgemm_batch_strided_symbol());
  return batch;
}

// The gather buffer of the kernels queued on `stream`, at least `floats` long. Taken in eval,
// where a failed allocation can still be reported, and shared by every kernel of the stream: a
// stream runs its tasks one at a time, so they never use it at once, and reusing it spares each
// call a page fault per 4 KiB. A larger request replaces it; tasks already queued keep the old
// one alive.
std::shared_ptr<std::vector<float>> patch_scratch(const mx::Stream& stream, size_t floats);

// Whether the stream is the CPU's and every array float32: where the kernels run.
bool cpu_float32(const mx::Stream& stream, std::initializer_list<const mx::array*> xs);

// ---- Products over a weight packed in column panels (cpu_panels.cpp) ------------------------
//
// Operands are 32-bit words: a float32, or a pair of bf16 along k (the bf16 products). A is
// rows of words; the weight B [n × k] goes in panels of kPanelRows rows, word u of row c at
// panel[u][c], rows past n zero (and a bf16 row's missing last half-pair).
constexpr size_t kPanelRows = 32;

// Whether this CPU runs the panel products (AVX-512), and the bf16 ones (AVX512-BF16).
bool panel_products_available();
bool bf16_dot_available();
// v rounded to bf16 (to nearest, ties to even; a NaN stays a NaN), as its bits.
uint16_t round_to_bf16_bits(float v);
// x [m × k] float32 as bf16 rows of kp ≥ k values (the rest zero); one row of it.
void to_bf16_rows(const float* x, size_t m, size_t k, uint16_t* out, size_t kp);
void row_to_bf16(const float* x, size_t k, uint16_t* out, size_t kp);
// A panel from its kPanelRows rows of `words` words each ([kPanelRows × words]).
void pack_panel(const uint32_t* rows, size_t words, uint32_t* panel);
// A quantized weight's rows as the panel packer reads them: `bits`-bit values packed little-
// endian (row r at packed + r·row_bytes), one scale (and bias, for affine weights) per group of
// `group` values, `groups_per_row` of them a row; no biases means symmetric,
// scale · (q − 2^(bits−1)).
enum class ScaleType { F32, F16, BF16 };
struct QuantRows {
  const uint8_t* packed;
  size_t row_bytes;
  const void* scales;
  const void* biases;
  ScaleType scale_type;
  int bits;
  size_t group;
  size_t groups_per_row;
};
// Whether pack_panel_quantized takes such a weight (4 or 8 bits, groups and k in 16s).
bool packs_quantized(int bits, size_t group, size_t k);
// A float32 panel of rows [r0, r0 + rows) (rows ≤ kPanelRows; the rest zero) of a quantized
// weight of k columns, the values as cpu_linear.cpp's dequantizers compute them, widened and
// transposed sixteen at a time in registers.
void pack_panel_quantized(const QuantRows& q, size_t r0, size_t rows, size_t k, uint32_t* panel);
// Columns of panels [panel0, panel1) of C [m × n] (row stride ldc) = A · Bᵀ (+ bias), A [m ×
// words], in float32 (FMA) or, with `bf16`, in bf16 pairs with float32 sums; one thread's share
// of a product.
void gemm_panels(bool bf16, const uint32_t* a, size_t m, size_t words, const uint32_t* panels, size_t panel0,
                 size_t panel1, size_t n, float* c, size_t ldc, const float* bias);

}  // namespace mlxs::detail
