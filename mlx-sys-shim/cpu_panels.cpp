// Matrix products over a weight packed in column panels, on AVX-512: float32 products (FMA),
// and bf16 products with float32 sums (AVX512-BF16's vdpbf16ps: 32 multiply-adds per
// instruction, twice float32's rate per core).
//
// C[m × n] = A[m × k] · Bᵀ. Both kinds work on 32-bit words: a float32, or a pair of bf16 along
// k. A is rows of words; B (the weight, n × k) is panels of 32 of its rows, word u of row c at
// panel[u][c], so that one 64-byte load holds a word for 16 columns, which the inner kernel
// multiplies by a broadcast word of A. The linear-layer kernel widens its weights straight
// into that layout, a panel at a time, while the panel is in the core's cache: no separate
// packing pass over a widened copy, as a BLAS needs.
//
// Blocking: k in blocks of 512 words (a panel's block, 64 KiB, stays in L2 while every row
// block of A passes over it), A in blocks of 96 rows (192 KiB), 12 rows × 32 columns of C in
// 24 registers per step of the inner kernel.
#include "cpu_common.h"

#include <array>

#if defined(__x86_64__) && defined(__GNUC__)
// GCC's AVX-512 unpack intrinsics start from _mm512_undefined_epi32(), which its own
// -Wuninitialized then reports at every call; the value is never read.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#define MLXS_PANEL_KERNELS 1
#define MLXS_AVX512_TARGET __attribute__((target("avx512f,f16c")))
// GCC would fuse a product and a sum of intrinsics into one FMA; clang contracts only within one
// source expression, never across intrinsics, and has no `optimize` attribute.
#if defined(__clang__)
#define MLXS_UNFUSED_AVX512_TARGET MLXS_AVX512_TARGET
#else
#define MLXS_UNFUSED_AVX512_TARGET __attribute__((target("avx512f,f16c"), optimize("fp-contract=off")))
#endif
#define MLXS_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#endif

namespace mlxs::detail {

#ifdef MLXS_PANEL_KERNELS
namespace {

constexpr size_t kWordsPerBlock = 512;
constexpr size_t kRowsPerBlock = 96;
constexpr int kRowsPerStep = 12;

}  // namespace
#endif

bool panel_products_available() {
#ifdef MLXS_PANEL_KERNELS
  // Every AVX-512 processor has F16C; GCC can ask for it by name, clang (before 16) cannot.
#if defined(__clang__)
  static const bool available = __builtin_cpu_supports("avx512f");
#else
  static const bool available = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("f16c");
#endif
  return available;
#else
  return false;
#endif
}

bool bf16_dot_available() {
#ifdef MLXS_PANEL_KERNELS
  static const bool available = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  return available;
#else
  return false;
#endif
}

uint16_t round_to_bf16_bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

#ifdef MLXS_PANEL_KERNELS

namespace {

// Adds acc into rows [0, MR) of C's 32-column block: C = acc + C (a later block of k) or
// acc + bias (the first), the columns past `cols` untouched.
template <int MR>
MLXS_AVX512_TARGET inline void store_block(__m512 (&lo)[MR], __m512 (&hi)[MR], float* c, size_t ldc, size_t cols,
                                           bool accumulate, const float* bias) {
  const __mmask16 m0 = cols >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << cols) - 1);
  const __mmask16 m1 = cols >= 32 ? __mmask16(0xFFFF) : cols > 16 ? __mmask16((1u << (cols - 16)) - 1) : 0;
  for (int i = 0; i < MR; ++i) {
    float* row = c + i * ldc;
    if (accumulate) {
      lo[i] = _mm512_add_ps(lo[i], _mm512_maskz_loadu_ps(m0, row));
      hi[i] = _mm512_add_ps(hi[i], _mm512_maskz_loadu_ps(m1, row + 16));
    } else if (bias != nullptr) {
      lo[i] = _mm512_add_ps(lo[i], _mm512_maskz_loadu_ps(m0, bias));
      hi[i] = _mm512_add_ps(hi[i], _mm512_maskz_loadu_ps(m1, bias + 16));
    }
    _mm512_mask_storeu_ps(row, m0, lo[i]);
    _mm512_mask_storeu_ps(row + 16, m1, hi[i]);
  }
}

// Rows [0, MR) of a 32-column block of C over `words` words of k.
template <int MR>
MLXS_AVX512_TARGET void micro_f32(const uint32_t* a, size_t lda, const uint32_t* panel, size_t words, float* c,
                                  size_t ldc, size_t cols, bool accumulate, const float* bias) {
  __m512 lo[MR], hi[MR];
  for (int i = 0; i < MR; ++i) lo[i] = hi[i] = _mm512_setzero_ps();
  const float* af = reinterpret_cast<const float*>(a);
  const float* pf = reinterpret_cast<const float*>(panel);
  for (size_t u = 0; u < words; ++u) {
    const __m512 b0 = _mm512_loadu_ps(pf + u * 32);
    const __m512 b1 = _mm512_loadu_ps(pf + u * 32 + 16);
    for (int i = 0; i < MR; ++i) {
      const __m512 ai = _mm512_set1_ps(af[i * lda + u]);
      lo[i] = _mm512_fmadd_ps(ai, b0, lo[i]);
      hi[i] = _mm512_fmadd_ps(ai, b1, hi[i]);
    }
  }
  store_block<MR>(lo, hi, c, ldc, cols, accumulate, bias);
}

template <int MR>
MLXS_BF16_TARGET void micro_bf16(const uint32_t* a, size_t lda, const uint32_t* panel, size_t words, float* c,
                                 size_t ldc, size_t cols, bool accumulate, const float* bias) {
  __m512 lo[MR], hi[MR];
  for (int i = 0; i < MR; ++i) lo[i] = hi[i] = _mm512_setzero_ps();
  for (size_t u = 0; u < words; ++u) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(panel + u * 32);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(panel + u * 32 + 16);
    for (int i = 0; i < MR; ++i) {
      const __m512bh ai = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[i * lda + u]));
      lo[i] = _mm512_dpbf16_ps(lo[i], ai, b0);
      hi[i] = _mm512_dpbf16_ps(hi[i], ai, b1);
    }
  }
  store_block<MR>(lo, hi, c, ldc, cols, accumulate, bias);
}

using Micro = void (*)(const uint32_t*, size_t, const uint32_t*, size_t, float*, size_t, size_t, bool,
                       const float*);

template <int... R>
constexpr std::array<Micro, sizeof...(R)> f32_table(std::integer_sequence<int, R...>) {
  return {&micro_f32<R + 1>...};
}
template <int... R>
constexpr std::array<Micro, sizeof...(R)> bf16_table(std::integer_sequence<int, R...>) {
  return {&micro_bf16<R + 1>...};
}

// The inner kernels for 1 … 12 rows, for the rows a block ends with.
const auto kF32Micros = f32_table(std::make_integer_sequence<int, kRowsPerStep>{});
const auto kBf16Micros = bf16_table(std::make_integer_sequence<int, kRowsPerStep>{});

MLXS_BF16_TARGET void rows_to_bf16(const float* x, size_t k, size_t kp, uint16_t* out) {
  size_t i = 0;
  for (; i + 32 <= k; i += 32) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
    _mm512_storeu_si512(out + i, (__m512i)v);
  }
  for (; i < k; ++i) out[i] = round_to_bf16_bits(x[i]);
  for (; i < kp; ++i) out[i] = 0;
}

// A 16 × 16 block of 32-bit words transposed in registers: r[j] word i becomes r[i] word j.
MLXS_AVX512_TARGET void transpose16_regs(__m512i (&r)[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xDD);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xDD);
    r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xDD);
  }
}

// out[j][i] = in[i][j] for a 16 × 16 block of 32-bit words (rows `stride` words apart).
MLXS_AVX512_TARGET void transpose16(const uint32_t* in, size_t in_stride, uint32_t* out, size_t out_stride) {
  __m512i r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(in + i * in_stride);
  transpose16_regs(r);
  for (int i = 0; i < 16; ++i) _mm512_storeu_si512(out + i * out_stride, r[i]);
}

// bf16 rounding (to nearest, ties to even) of finite float32 lanes, kept as float32.
MLXS_AVX512_TARGET inline __m512 round_bf16(__m512 v) {
  __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  bits = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd));
  return _mm512_castsi512_ps(_mm512_and_si512(bits, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// f16 rounding (to nearest, ties to even) of float32 lanes, kept as float32.
MLXS_AVX512_TARGET inline __m512 round_f16(__m512 v) {
  return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

MLXS_AVX512_TARGET inline float scale_at(const QuantRows& q, size_t i) {
  switch (q.scale_type) {
    case ScaleType::F32:
      return static_cast<const float*>(q.scales)[i];
    case ScaleType::F16:
      return _cvtsh_ss(static_cast<const uint16_t*>(q.scales)[i]);
    default: {
      const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(q.scales)[i]) << 16;
      float f;
      std::memcpy(&f, &bits, sizeof f);
      return f;
    }
  }
}

// Values [u, u + 16) of row `r`, exactly as the scalar dequantizers of cpu_linear.cpp compute
// them (MLX's own arithmetic for affine weights, the exact product for symmetric ones): never
// fused into one FMA, which would round once where MLX rounds twice.
MLXS_UNFUSED_AVX512_TARGET inline __m512 dequantize16(const QuantRows& q, size_t r, size_t u) {
  const uint8_t* row = q.packed + r * q.row_bytes;
  __m512i v;
  if (q.bits == 4) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + u / 2));
    const __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
    v = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
  } else {
    v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + u)));
  }
  const size_t g = r * q.groups_per_row + u / q.group;
  const __m512 s = _mm512_set1_ps(scale_at(q, g));
  if (q.biases == nullptr) {
    const __m512i zero = _mm512_set1_epi32(1 << (q.bits - 1));
    return _mm512_mul_ps(s, _mm512_cvtepi32_ps(_mm512_sub_epi32(v, zero)));
  }
  QuantRows bq = q;
  bq.scales = q.biases;
  const __m512 b = _mm512_set1_ps(scale_at(bq, g));
  const __m512 p = _mm512_mul_ps(s, _mm512_cvtepi32_ps(v));
  switch (q.scale_type) {
    case ScaleType::F32:
      return _mm512_add_ps(p, b);
    case ScaleType::F16:
      return round_f16(_mm512_add_ps(round_f16(p), b));
    default:
      return round_bf16(_mm512_add_ps(round_bf16(p), b));
  }
}

}  // namespace

bool packs_quantized(int bits, size_t group, size_t k) {
  return panel_products_available() && (bits == 4 || bits == 8) && group % 16 == 0 && k % 16 == 0;
}

MLXS_AVX512_TARGET void pack_panel_quantized(const QuantRows& q, size_t r0, size_t rows, size_t k, uint32_t* panel) {
  for (size_t c0 = 0; c0 < kPanelRows; c0 += 16) {
    for (size_t u = 0; u < k; u += 16) {
      __m512i r[16];
      for (size_t i = 0; i < 16; ++i) {
        r[i] = c0 + i < rows ? _mm512_castps_si512(dequantize16(q, r0 + c0 + i, u)) : _mm512_setzero_si512();
      }
      transpose16_regs(r);
      for (int i = 0; i < 16; ++i) _mm512_storeu_si512(panel + (u + i) * kPanelRows + c0, r[i]);
    }
  }
}

void to_bf16_rows(const float* x, size_t m, size_t k, uint16_t* out, size_t kp) {
  if (m * k < (size_t{1} << 16)) {
    for (size_t r = 0; r < m; ++r) rows_to_bf16(x + r * k, k, kp, out + r * kp);
    return;
  }
  parallel_for(m, k, [&](size_t r0, size_t r1, size_t) {
    for (size_t r = r0; r < r1; ++r) rows_to_bf16(x + r * k, k, kp, out + r * kp);
  });
}

void row_to_bf16(const float* x, size_t k, uint16_t* out, size_t kp) { rows_to_bf16(x, k, kp, out); }

void pack_panel(const uint32_t* rows, size_t words, uint32_t* panel) {
  size_t u = 0;
  for (; u + 16 <= words; u += 16) {
    for (size_t c0 = 0; c0 < kPanelRows; c0 += 16) {
      transpose16(rows + c0 * words + u, words, panel + u * kPanelRows + c0, kPanelRows);
    }
  }
  for (; u < words; ++u) {
    for (size_t c = 0; c < kPanelRows; ++c) std::memcpy(panel + u * kPanelRows + c, rows + c * words + u, 4);
  }
}

void gemm_panels(bool bf16, const uint32_t* a, size_t m, size_t words, const uint32_t* panels, size_t panel0,
                 size_t panel1, size_t n, float* c, size_t ldc, const float* bias) {
  const auto& micros = bf16 ? kBf16Micros : kF32Micros;
  const size_t panel_len = words * kPanelRows;
  for (size_t u0 = 0; u0 < words; u0 += kWordsPerBlock) {
    const size_t nu = std::min(kWordsPerBlock, words - u0);
    for (size_t m0 = 0; m0 < m; m0 += kRowsPerBlock) {
      const size_t m1 = std::min(m, m0 + kRowsPerBlock);
      for (size_t j = panel0; j < panel1; ++j) {
        const size_t col = j * kPanelRows;
        const size_t cols = std::min(kPanelRows, n - col);
        const uint32_t* panel = panels + j * panel_len + u0 * kPanelRows;
        for (size_t r = m0; r < m1; r += kRowsPerStep) {
          const size_t rows = std::min<size_t>(kRowsPerStep, m1 - r);
          micros[rows - 1](a + r * words + u0, words, panel, nu, c + r * ldc + col, ldc, cols, u0 > 0,
                           bias != nullptr ? bias + col : nullptr);
        }
      }
    }
  }
}

#else

void to_bf16_rows(const float*, size_t, size_t, uint16_t*, size_t) {
  throw std::logic_error("[panels] products need AVX-512");
}

void row_to_bf16(const float*, size_t, uint16_t*, size_t) { throw std::logic_error("[panels] products need AVX-512"); }

void pack_panel(const uint32_t*, size_t, uint32_t*) { throw std::logic_error("[panels] products need AVX-512"); }

void gemm_panels(bool, const uint32_t*, size_t, size_t, const uint32_t*, size_t, size_t, size_t, float*, size_t,
                 const float*) {
  throw std::logic_error("[panels] products need AVX-512");
}

bool packs_quantized(int, size_t, size_t) { return false; }

void pack_panel_quantized(const QuantRows&, size_t, size_t, size_t, uint32_t*) {
  throw std::logic_error("[panels] products need AVX-512");
}

#endif

}  // namespace mlxs::detail

namespace mlxs {

bool bf16_products_available() { return detail::bf16_dot_available(); }

}  // namespace mlxs
