// Linear layers over weights kept in their stored form (bf16/f16, affine-quantized).
#include "cpu_common.h"

using namespace mlxs::detail;

namespace {

// ---- Linear layers over weights kept in their stored form ----------------------------------
//
// A weight stored in bf16/f16, or affine-quantized, is widened to float32 one tile of rows at a
// time into the stream's scratch buffer and multiplied there by one sgemm: the float32 copy of a
// large layer never exists, and the product still runs near the BLAS's rate. Tiles of 64 MiB
// (the real transformer's attention weights in one) measured 5-20% faster than 16 MiB ones, and
// 1-4 MiB ones much slower: every sgemm call packs the activations again.
constexpr size_t kWeightTileBytes = size_t{64} << 20;

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

// One row of a symmetric-quantized weight (GGUF's Q4_0, Q5_0 and Q8_0 kept as they come):
// element i is scale · (q − 2^(Bits−1)) of its group, in float32 whatever the scales are stored
// in. The scales hold ggml's f16 `d` exactly and |q − 2^(Bits−1)| ≤ 2^(Bits−1), so the one
// product is exact, as ggml's own dequantization computes it.
template <int Bits, typename Scale>
MLXS_VECTOR_CLONES void dequantize_row_symmetric(const uint32_t* __restrict packed, const Scale* __restrict scales,
                                                 float* __restrict dst, size_t k, size_t group) {
  constexpr int per_byte = 8 / Bits;
  constexpr uint32_t mask = (1u << Bits) - 1u;
  constexpr int zero = 1 << (Bits - 1);
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(packed);
  const size_t bytes_per_group = group / per_byte;
  for (size_t g = 0; g < k / group; ++g) {
    const float s = static_cast<float>(scales[g]);
    const uint8_t* in = bytes + g * bytes_per_group;
    float* out = dst + g * group;
    for (size_t c = 0; c < bytes_per_group; ++c) {
      const uint32_t byte = in[c];
      for (int j = 0; j < per_byte; ++j) {
        out[c * per_byte + j] = s * static_cast<float>(static_cast<int>((byte >> (j * Bits)) & mask) - zero);
      }
    }
  }
}

// How a linear layer's weight is kept.
struct WeightForm {
  mx::Dtype dtype;  // of the dense weight, or of the scales when quantized
  bool quantized;
  bool symmetric;  // quantized without biases: scale · (q − 2^(bits−1))
  int bits;
  int group;
};

// Rows [r0, r1) of the weight as float32, into dst (row stride k).
void widen_rows(const WeightForm& form, const mx::array& w, const mx::array* scales, const mx::array* biases,
                size_t r0, size_t r1, size_t k, float* dst) {
  if (!form.quantized && form.dtype == mx::float32) {
    std::memcpy(dst, w.data<float>() + r0 * k, sizeof(float) * (r1 - r0) * k);
    return;
  }
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
    if (form.symmetric) {
      for (size_t r = r0; r < r1; ++r) {
        dequantize_row_symmetric<Bits, Scale>(w.data<uint32_t>() + r * words, s + r * groups, dst + (r - r0) * k,
                                              k, form.group);
      }
      return;
    }
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

// How a product runs: the weight widened to float32 rows and multiplied by the BLAS's sgemm,
// or packed in column panels (cpu_panels.cpp) and multiplied in float32 or bf16.
enum class Products { Sgemm, PanelsF32, PanelsBf16 };

// Panels [j0, j1) of the weight's rows from n0 on (n rows in all), packed: for float32 products
// each row widened as `widen_rows` does; for bf16 ones rows kept in bf16 as they are, every
// other form widened, then rounded. Rows past n are zero.
void pack_rows(const WeightForm& form, bool bf16, const mx::array& w, const mx::array* scales,
               const mx::array* biases, size_t n0, size_t n, size_t k, size_t j0, size_t j1, uint32_t* panels) {
  const size_t words = bf16 ? (k + 1) / 2 : k;
  const size_t panel_len = words * kPanelRows;
  const bool as_is = bf16 && form.dtype == mx::bfloat16 && !form.quantized && k % 2 == 0;
  if (!bf16 && form.quantized && packs_quantized(form.bits, form.group, k)) {
    const QuantRows q{w.data<uint8_t>(),
                      k * form.bits / 8,
                      scales->data<void>(),
                      biases != nullptr ? biases->data<void>() : nullptr,
                      form.dtype == mx::float32   ? ScaleType::F32
                      : form.dtype == mx::float16 ? ScaleType::F16
                                                  : ScaleType::BF16,
                      form.bits,
                      static_cast<size_t>(form.group),
                      k / form.group};
    for (size_t j = j0; j < j1; ++j) {
      const size_t r0 = n0 + j * kPanelRows;
      pack_panel_quantized(q, r0, std::min(kPanelRows, n - std::min(n, r0)), k, panels + j * panel_len);
    }
    return;
  }
  std::vector<float> row(bf16 && !as_is ? k : 0);
  std::vector<uint32_t> rows(panel_len);
  for (size_t j = j0; j < j1; ++j) {
    for (size_t c = 0; c < kPanelRows; ++c) {
      const size_t r = n0 + j * kPanelRows + c;
      uint32_t* dst = rows.data() + c * words;
      if (r >= n) {
        std::fill(dst, dst + words, uint32_t{0});
      } else if (!bf16) {
        widen_rows(form, w, scales, biases, r, r + 1, k, reinterpret_cast<float*>(dst));
      } else if (as_is) {
        std::memcpy(dst, w.data<uint16_t>() + r * k, sizeof(uint16_t) * k);
      } else {
        widen_rows(form, w, scales, biases, r, r + 1, k, row.data());
        row_to_bf16(row.data(), k, reinterpret_cast<uint16_t*>(dst), 2 * words);
      }
    }
    pack_panel(rows.data(), words, panels + j * panel_len);
  }
}

// y[M, N] = x[M, K] · Wᵀ (+ bias), W [N, K] in a narrow form (inputs: x, w, [scales, biases],
// [bias]), as an MLX primitive on a CPU stream. With `bf16` the products take bf16 inputs
// (cpu_bf16.cpp), the weight packed in bf16 panels instead of widened to float32 rows.
class CpuNarrowLinear : public CpuOnlyPrimitive {
 public:
  CpuNarrowLinear(mx::Stream stream, WeightForm form, bool has_bias, Sgemm sgemm, Products products)
      : CpuOnlyPrimitive(stream, "CpuNarrowLinear"),
        form_(form),
        has_bias_(has_bias),
        sgemm_(sgemm),
        products_(products) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    if (products_ != Products::Sgemm) return eval_panels(inputs, out);
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
      const mx::array* biases = form.quantized && !form.symmetric ? &inputs[3] : nullptr;
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
           o->form_.symmetric == form_.symmetric && o->form_.bits == form_.bits && o->form_.group == form_.group &&
           o->has_bias_ == has_bias_ && o->products_ == products_;
  }

 private:
  // The panel forms: x as words (float32 as it is, or rounded to bf16 pairs once), then per
  // tile of the weight's rows each core packs its panels and multiplies them, so a panel is
  // used while it is still in that core's cache.
  void eval_panels(const std::vector<mx::array>& inputs, mx::array& out) {
    const mx::array& x = inputs[0];
    auto& encoder = begin(inputs, out);
    const bool bf16 = products_ == Products::PanelsBf16;
    const size_t m = x.shape(0), k = x.shape(1), n = out.shape(1);
    const size_t words = bf16 ? (k + 1) / 2 : k;
    const size_t panel_len = words * kPanelRows;
    const size_t panels_total = (n + kPanelRows - 1) / kPanelRows;
    const size_t tile_panels = std::max<size_t>(
        1, std::min(panels_total, kWeightTileBytes / (sizeof(uint32_t) * std::max<size_t>(panel_len, 1))));
    // One scratch buffer holds x as bf16 pairs (none for float32), then the tile's panels.
    const size_t a_words = bf16 ? m * words : 0;
    auto scratch = patch_scratch(stream(), a_words + tile_panels * panel_len);
    encoder.dispatch([inputs, form = form_, bf16, has_bias = has_bias_, m, k, n, words, tile_panels,
                      a_words, scratch, dst = out.data<float>()]() {
      const mx::array& x = inputs[0];
      const mx::array& w = inputs[1];
      const mx::array* scales = form.quantized ? &inputs[2] : nullptr;
      const mx::array* biases = form.quantized && !form.symmetric ? &inputs[3] : nullptr;
      const float* bias = has_bias ? inputs.back().data<float>() : nullptr;
      auto* words_scratch = reinterpret_cast<uint32_t*>(scratch->data());
      const uint32_t* a = reinterpret_cast<const uint32_t*>(x.data<float>());
      if (bf16) {
        to_bf16_rows(x.data<float>(), m, k, reinterpret_cast<uint16_t*>(words_scratch), 2 * words);
        a = words_scratch;
      }
      uint32_t* panels = words_scratch + a_words;
      const size_t tile_rows = tile_panels * kPanelRows;
      for (size_t n0 = 0; n0 < n; n0 += tile_rows) {
        const size_t nb = std::min(tile_rows, n - n0);
        const size_t np = (nb + kPanelRows - 1) / kPanelRows;
        parallel_for(np, kPanelRows * k * std::max<size_t>(m, 1), [&](size_t j0, size_t j1, size_t) {
          pack_rows(form, bf16, w, scales, biases, n0, n, k, j0, j1, panels);
          if (m > 0) gemm_panels(bf16, a, m, words, panels, j0, j1, nb, dst + n0, n, bias ? bias + n0 : nullptr);
        });
      }
    });
  }

  WeightForm form_;
  bool has_bias_;
  Sgemm sgemm_;
  Products products_;
};

}  // namespace

namespace mlxs {

std::pair<mx::array, mx::array> symmetric_as_affine(const mx::array& scales, int bits, mx::Dtype dtype) {
  auto s = mx::astype(scales, dtype);
  return {s, mx::multiply(s, mx::array(-static_cast<float>(1 << (bits - 1)), dtype))};
}

mx::array dequantize(const mx::array& w, const mx::array& scales, const std::optional<mx::array>& biases,
                     int group_size, int bits, const std::string& mode) {
  if (mode != "symmetric") return mx::dequantize(w, scales, biases, group_size, bits, mode);
  if (biases) throw std::invalid_argument("[dequantize] symmetric quantization has no biases");
  // In float32, where every value scale · (q − 2^(bits−1)) of an f16 scale is exact.
  auto [s, b] = symmetric_as_affine(scales, bits, mx::float32);
  return mx::dequantize(w, s, b, group_size, bits, "affine");
}

mx::array linear(const mx::array& x, const mx::array& w, const std::optional<mx::array>& scales,
                 const std::optional<mx::array>& biases, const std::optional<mx::array>& bias, int group_size,
                 int bits, const std::string& mode, bool bf16_products) {
  const bool quantized = scales.has_value();
  const bool symmetric = mode == "symmetric";
  const bool affine = mode == "affine" || symmetric;
  if (x.ndim() < 1 || w.ndim() != 2) throw std::invalid_argument("[linear] expects x [..., K] and a 2-D weight");
  const int k = x.shape(-1), n = w.shape(0);
  if (quantized && affine) {
    if (symmetric && biases) throw std::invalid_argument("[linear] a symmetric-quantized weight has no biases");
    if (!symmetric && !biases) throw std::invalid_argument("[linear] an affine-quantized weight needs its biases");
    if (bits <= 0 || bits > 8 || group_size <= 0 || k % group_size != 0 || w.shape(1) * 32 != k * bits ||
        scales->shape() != mx::Shape{n, k / group_size} || (biases && biases->shape() != scales->shape())) {
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
  // bf16 products where the CPU has them; elsewhere the request falls back to float32 ones,
  // in panels on AVX-512, else through sgemm.
  const bool bf16 = bf16_products && bf16_dot_available();
  const Products products = bf16 ? Products::PanelsBf16
                                 : panel_products_available() ? Products::PanelsF32
                                                              : Products::Sgemm;
  const bool kernel_fits = quantized ? affine && (bits == 2 || bits == 4 || bits == 8) && group_size % (32 / bits) == 0 &&
                                           (narrow_float || form_dtype == mx::float32) && w.dtype() == mx::uint32
                                     : narrow_float || (bf16 && form_dtype == mx::float32);
  if (sgemm != nullptr && stream.device == mx::Device::cpu && x.dtype() == mx::float32 && kernel_fits &&
      (!bias || bias->dtype() == mx::float32)) {
    std::vector<mx::array> inputs{mx::contiguous(mx::reshape(x, {-1, k})), mx::contiguous(w)};
    if (quantized) {
      inputs.push_back(mx::contiguous(*scales));
      if (!symmetric) inputs.push_back(mx::contiguous(*biases));
    }
    if (bias) inputs.push_back(mx::contiguous(mx::reshape(*bias, {n})));
    const int rows = static_cast<int>(x.size() / std::max(k, 1));
    auto y = mx::array(
        {rows, n}, mx::float32,
        std::make_shared<CpuNarrowLinear>(stream, WeightForm{form_dtype, quantized, symmetric, bits, group_size},
                                          bias.has_value(), sgemm, products),
        std::move(inputs));
    return mx::reshape(y, out_shape);
  }
  // Elsewhere MLX's ops: quantized_matmul for a quantized weight (a GPU kernel that never
  // expands it), else a product with the weight in x's dtype. On the CPU this expands one layer
  // at a time, as the graph reaches it.
  mx::array y = [&] {
    if (!quantized) return mx::matmul(x, mx::transpose(w.dtype() == x.dtype() ? w : mx::astype(w, x.dtype())));
    if (stream.device == mx::Device::cpu) {
      return mx::matmul(x, mx::transpose(mx::astype(dequantize(w, *scales, biases, group_size, bits, mode), x.dtype())));
    }
    // Affine scales and biases take x's dtype (a symmetric weight's biases made from its
    // scales); the float modes' scales are bytes (E8M0, E4M3).
    if (symmetric) {
      auto [s, b] = symmetric_as_affine(*scales, bits, x.dtype());
      return mx::quantized_matmul(x, w, s, b, true, group_size, bits, "affine");
    }
    auto like_x = [&](const mx::array& a) { return affine ? mx::astype(a, x.dtype()) : a; };
    std::optional<mx::array> qbiases = biases ? std::optional<mx::array>(like_x(*biases)) : std::nullopt;
    return mx::quantized_matmul(x, w, like_x(*scales), qbiases, true, group_size, bits, mode);
  }();
  return bias ? mx::add(y, mx::astype(*bias, x.dtype())) : y;
}

}  // namespace mlxs
