// Convolutions as BLAS products: gathered patches times the weight, and stride-1 3×3 by
// Winograd's F(4×4, 3×3).
#include "cpu_common.h"

using namespace mlxs::detail;

namespace {

// A convolution of NHWC float32 by a k×k kernel with a stride and `pad` zero rows and columns
// before the input (zeros also wherever a patch reaches past its end) as matrix products: for a
// block of output pixels, their k×k input patches are gathered into rows ("im2col") and
// multiplied by the [k·k·I, O] weight matrix in one sgemm with K = k·k·I, accumulating onto the
// bias. Each output is written once, where one product per tap reads and writes it k² times.
// Blocks of gathered rows of at most kPatchBytes stay in the last-level cache between the gather
// and the product (4–8 MiB measured best, 32 MiB 5% slower on a 32 MiB L3). A 1×1 kernel at
// stride 1 multiplies the input as it is.
constexpr size_t kPatchBytes = size_t{8} << 20;

class CpuConv2d : public CpuOnlyPrimitive {
 public:
  CpuConv2d(mx::Stream stream, int k, int stride, int pad, Sgemm sgemm)
      : CpuOnlyPrimitive(stream, "CpuConv2d"), k_(k), stride_(stride), pad_(pad), sgemm_(sgemm) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const mx::array& x = inputs[0];
    const mx::array& w = inputs[1];
    const mx::array& bias = inputs[2];
    auto& encoder = begin(inputs, out);
    const bool gather = k_ > 1 || stride_ > 1;
    const int pixels = out.shape(1) * out.shape(2), depth = k_ * k_ * x.shape(3);
    const int block = gather ? std::max(64, static_cast<int>(kPatchBytes / (sizeof(float) * depth))) : pixels;
    auto scratch = patch_scratch(stream(), gather ? static_cast<size_t>(std::min(block, pixels)) * depth : 0);
    encoder.dispatch([x, w, bias, src = x.data<float>(), wt = w.data<float>(), b = bias.data<float>(),
                      dst = out.data<float>(), batch = x.shape(0), h = x.shape(1), wd = x.shape(2), cin = x.shape(3),
                      ow = out.shape(2), cout = out.shape(3), k = k_, stride = stride_, pad = pad_, sgemm = sgemm_,
                      gather, pixels, depth, block, scratch]() {
      float* patches = scratch->data();
      for (int n = 0; n < batch; ++n) {
        const float* image = src + static_cast<size_t>(n) * h * wd * cin;
        float* result = dst + static_cast<size_t>(n) * pixels * cout;
        for (int p0 = 0; p0 < pixels; p0 += block) {
          const int m = std::min(block, pixels - p0);
          const float* a = image + static_cast<size_t>(p0) * cin;
          if (gather) {
            parallel_for(m, depth, [&](size_t r0, size_t r1, size_t) {
              for (size_t r = r0; r < r1; ++r) {
                const int i = (p0 + static_cast<int>(r)) / ow, j = (p0 + static_cast<int>(r)) % ow;
                float* row = patches + r * depth;
                for (int dy = 0; dy < k; ++dy) {
                  const int y = i * stride + dy - pad;
                  float* taps = row + static_cast<size_t>(dy) * k * cin;
                  if (y < 0 || y >= h) {
                    std::memset(taps, 0, sizeof(float) * k * cin);
                    continue;
                  }
                  // The row's k taps are k neighbouring pixels: one copy, less what lies off the edge.
                  const int x0 = j * stride - pad, lo = std::clamp(-x0, 0, k), hi = std::clamp(wd - x0, lo, k);
                  if (lo > 0) std::memset(taps, 0, sizeof(float) * lo * cin);
                  std::memcpy(taps + static_cast<size_t>(lo) * cin,
                              image + (static_cast<size_t>(y) * wd + x0 + lo) * cin, sizeof(float) * (hi - lo) * cin);
                  if (hi < k) std::memset(taps + static_cast<size_t>(hi) * cin, 0, sizeof(float) * (k - hi) * cin);
                }
              }
            });
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
    return o != nullptr && o->k_ == k_ && o->stride_ == stride_ && o->pad_ == pad_;
  }

 private:
  int k_, stride_, pad_;
  Sgemm sgemm_;
};

// ---- 3×3 convolutions by Winograd's minimal filtering, F(4×4, 3×3) ---------------------------
//
// Each 4×4 block of outputs ("tile") comes from its 6×6 input patch d and the 3×3 filter g as
//   Y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A          (Lavin & Gray, "Fast Algorithms for CNNs", 2016)
// where the matrices interpolate at the points 0, 1, −1, ½, −2 and ∞. Summed over the input
// channels, each of the 36 element-wise products is one matrix product [tiles × I]·[I × O], run
// by the BLAS: 36 multiplications per tile and channel pair where the direct form takes 144
// (4× fewer; F(2×2, 3×3) takes 16 per 2×2 tile, 1.8× as many per output). Larger tiles round
// more: of the point sets for F(4×4) this one keeps the error lowest (Barabasz et al., "Error
// analysis and improving the accuracy of Winograd convolution for deep neural networks", 2020),
// about 4× F(2×2)'s; the weight transform runs in double, once per call.
constexpr size_t kTile = 4;              // outputs per tile side
constexpr size_t kPatch = kTile + 2;     // inputs per tile side
constexpr size_t kProducts = kPatch * kPatch;
constexpr size_t kWinogradChunk = 64;

// G, for the weights' transform (in double).
constexpr double kG[kPatch][3] = {
    {1.0, 0.0, 0.0},
    {1.0 / 3, 1.0 / 3, 1.0 / 3},
    {-1.0 / 3, 1.0 / 3, -1.0 / 3},
    {-16.0 / 15, -8.0 / 15, -4.0 / 15},
    {1.0 / 15, -2.0 / 15, 4.0 / 15},
    {0.0, 0.0, 1.0},
};

// Bᵀ x of six values, as its rows [1 −3/2 −2 3/2 1 0; 0 −1 ½ 5/2 1 0; 0 1 −5/2 ½ 1 0;
// 0 −2 −1 2 1 0; 0 ½ −1 −½ 1 0; 0 1 −3/2 −2 3/2 1] written out, sharing what they share.
__attribute__((always_inline)) inline void bt_six(const float (&x)[kPatch], float (&r)[kPatch]) {
  const float a = x[3] - x[1], b = x[4] - x[2];
  r[0] = x[0] - 2.0f * x[2] + x[4] + 1.5f * a;
  r[1] = x[4] - x[1] + 0.5f * x[2] + 2.5f * x[3];
  r[2] = x[4] + x[1] - 2.5f * x[2] + 0.5f * x[3];
  r[3] = b + 2.0f * a;
  r[4] = b - 0.5f * a;
  r[5] = x[1] - 1.5f * x[2] - 2.0f * x[3] + 1.5f * x[4] + x[5];
}

// Aᵀ x of six values, as its rows [1 1 1 1 1 0; 0 1 −1 ½ −2 0; 0 1 1 ¼ 4 0; 0 1 −1 ⅛ −8 1].
__attribute__((always_inline)) inline void at_six(const float (&x)[kPatch], float (&r)[kTile]) {
  const float p = x[1] + x[2], q = x[1] - x[2];
  r[0] = x[0] + p + x[3] + x[4];
  r[1] = q + 0.5f * x[3] - 2.0f * x[4];
  r[2] = p + 0.25f * x[3] + 4.0f * x[4];
  r[3] = q + 0.125f * x[3] - 8.0f * x[4] + x[5];
}

// G g Gᵀ for input channel `i` and every output channel: g[dy][dx] is row (dy·3 + dx)·I + i of
// the [9·I, O] weight matrix `w`; the 36 results go to u[ξ][i][·] of u [36, I, O].
void winograd_weight_row(const float* __restrict w, size_t cin, size_t cout, size_t i, float* __restrict u) {
  for (size_t o = 0; o < cout; ++o) {
    double g[3][3];
    for (size_t dy = 0; dy < 3; ++dy)
      for (size_t dx = 0; dx < 3; ++dx) g[dy][dx] = w[((dy * 3 + dx) * cin + i) * cout + o];
    double t[kPatch][3];  // G g
    for (size_t a = 0; a < kPatch; ++a)
      for (size_t dx = 0; dx < 3; ++dx) t[a][dx] = kG[a][0] * g[0][dx] + kG[a][1] * g[1][dx] + kG[a][2] * g[2][dx];
    for (size_t a = 0; a < kPatch; ++a)
      for (size_t b = 0; b < kPatch; ++b)
        u[((a * kPatch + b) * cin + i) * cout + o] =
            static_cast<float>(t[a][0] * kG[b][0] + t[a][1] * kG[b][1] + t[a][2] * kG[b][2]);
  }
}

// Bᵀ d B of one tile for channels [c0, c0 + n), n ≤ kWinogradChunk: d[r][c] points at the
// tile's input pixel (row r, column c), or at zeros beyond the image; result ξ goes to
// v + ξ·stride + c0.
MLXS_VECTOR_CLONES void winograd_input_tile(const float* const (&d)[kPatch][kPatch], size_t c0, size_t n,
                                            float* __restrict v, size_t stride) {
  float u[kPatch][kPatch][kWinogradChunk];  // Bᵀ d
  for (size_t j = 0; j < kPatch; ++j) {
    for (size_t c = 0; c < n; ++c) {
      float x[kPatch], r[kPatch];
      for (size_t k = 0; k < kPatch; ++k) x[k] = d[k][j][c0 + c];
      bt_six(x, r);
      for (size_t a = 0; a < kPatch; ++a) u[a][j][c] = r[a];
    }
  }
  for (size_t a = 0; a < kPatch; ++a) {
    float* out = v + a * kPatch * stride + c0;
    for (size_t c = 0; c < n; ++c) {
      float x[kPatch], r[kPatch];
      for (size_t k = 0; k < kPatch; ++k) x[k] = u[a][k][c];
      bt_six(x, r);
      for (size_t b = 0; b < kPatch; ++b) out[b * stride + c] = r[b];
    }
  }
}

// Aᵀ m A + bias (+ residual) of one tile for output channels [o0, o0 + n): product ξ is at
// m + ξ·stride; y[a][b] points at the tile's output pixel (a, b), null beyond the image, and
// r[a][b] at the residual's pixel, null when there is none. The residual is added to the biased
// sum, as an add after the convolution would.
MLXS_VECTOR_CLONES void winograd_output_tile(const float* __restrict m, size_t stride, const float* __restrict bias,
                                             size_t o0, size_t n, float* const (&y)[kTile][kTile],
                                             const float* const (&r)[kTile][kTile]) {
  float s[kTile][kPatch][kWinogradChunk];  // Aᵀ m
  for (size_t j = 0; j < kPatch; ++j) {
    for (size_t c = 0; c < n; ++c) {
      float x[kPatch], t[kTile];
      for (size_t k = 0; k < kPatch; ++k) x[k] = m[(k * kPatch + j) * stride + o0 + c];
      at_six(x, t);
      for (size_t a = 0; a < kTile; ++a) s[a][j][c] = t[a];
    }
  }
  float out[kTile][kWinogradChunk];  // one row of the tile, (Aᵀ m) A + bias
  for (size_t a = 0; a < kTile; ++a) {
    for (size_t c = 0; c < n; ++c) {
      float x[kPatch], t[kTile];
      for (size_t k = 0; k < kPatch; ++k) x[k] = s[a][k][c];
      at_six(x, t);
      for (size_t b = 0; b < kTile; ++b) out[b][c] = t[b] + bias[o0 + c];
    }
    for (size_t b = 0; b < kTile; ++b) {
      if (y[a][b] == nullptr) continue;
      if (r[a][b] == nullptr) {
        std::memcpy(y[a][b] + o0, out[b], sizeof(float) * n);
      } else {
        for (size_t c = 0; c < n; ++c) y[a][b][o0 + c] = out[b][c] + r[a][b][o0 + c];
      }
    }
  }
}

// A stride-1 "same" 3×3 convolution of NHWC float32 by F(4×4, 3×3), taking the [9·I, O] weight
// matrix the gathered form takes and transforming it once per call (a few milliseconds for the
// widest layer, against seconds of products). Tiles go in blocks whose transformed input and
// products (36 × tiles × (I + O) floats) fit kBlockBytes, so that they stay in the last-level
// cache between the transforms and the products. 32 MiB decoded fastest on a 32 MiB L3 (at
// 8 MiB a block of a 512-channel layer holds 56 tiles, too few rows for the products' speed).
//
// With `upsample` 2 the convolution reads the input enlarged ×2 by nearest neighbour (each pixel
// a 2×2 block) without making it: a tile's input pixel (y, x) is the input's (y/2, x/2). With a
// fourth input, that residual (shaped as the output) is added to each output. Both give the
// bytes the separate upsample and add give, without their buffers (4× the input, and one the
// size of the output) and passes over memory.
class CpuWinogradConv3x3 : public CpuOnlyPrimitive {
 public:
  CpuWinogradConv3x3(mx::Stream stream, Sgemm sgemm, int upsample)
      : CpuOnlyPrimitive(stream, "CpuWinogradConv3x3"), sgemm_(sgemm), upsample_(upsample) {}

  static constexpr size_t kBlockBytes = size_t{32} << 20;

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const mx::array& x = inputs[0];
    const mx::array& w = inputs[1];
    const mx::array& bias = inputs[2];
    const float* res = inputs.size() > 3 ? inputs[3].data<float>() : nullptr;
    auto& encoder = begin(inputs, out);
    const size_t up = upsample_, src_w = x.shape(2), cin = x.shape(3), cout = out.shape(3);
    const size_t h = out.shape(1), wd = out.shape(2);  // the (enlarged) input's size, and the output's
    const size_t tiles_w = (wd + kTile - 1) / kTile, tiles = (h + kTile - 1) / kTile * tiles_w;
    const size_t block =
        std::clamp<size_t>(kBlockBytes / (sizeof(float) * kProducts * (cin + cout)), 16, std::max<size_t>(tiles, 1));
    // Transformed weights, transformed input of a block, its products, and one zero pixel.
    auto scratch = patch_scratch(stream(), kProducts * (cin * cout + block * (cin + cout)) + cin);
    encoder.dispatch([inputs, src = x.data<float>(), wt = w.data<float>(), b = bias.data<float>(), res,
                      dst = out.data<float>(), batch = x.shape(0), up, src_w, h, wd, cin, cout, tiles_w, tiles, block,
                      scratch, sgemm = sgemm_]() {
      float* u = scratch->data();
      float* v = u + kProducts * cin * cout;
      float* m = v + kProducts * block * cin;
      float* zeros = m + kProducts * block * cout;
      std::fill(zeros, zeros + cin, 0.0f);
      parallel_for(cin, 256 * cout, [&](size_t i0, size_t i1, size_t) {
        for (size_t i = i0; i < i1; ++i) winograd_weight_row(wt, cin, cout, i, u);
      });
      for (size_t n = 0; n < static_cast<size_t>(batch); ++n) {
        const float* image = src + n * (h / up) * src_w * cin;
        float* result = dst + n * h * wd * cout;
        const float* residual = res == nullptr ? nullptr : res + n * h * wd * cout;
        for (size_t t0 = 0; t0 < tiles; t0 += block) {
          const size_t nt = std::min(block, tiles - t0);
          // A block's transform takes about a millisecond: worth a second thread (parallel_for's
          // cost is about bytes touched).
          parallel_for(nt, 64 * cin, [&](size_t b0, size_t b1, size_t) {
            for (size_t t = b0; t < b1; ++t) {
              const size_t ty = (t0 + t) / tiles_w, tx = (t0 + t) % tiles_w;
              const float* d[kPatch][kPatch];
              for (size_t r = 0; r < kPatch; ++r) {
                for (size_t c = 0; c < kPatch; ++c) {
                  // Input row kTile·ty + r - 1, column kTile·tx + c - 1 (unsigned: -1 wraps past
                  // the end).
                  const size_t y = kTile * ty + r - 1, xx = kTile * tx + c - 1;
                  d[r][c] = y < h && xx < wd ? image + ((y / up) * src_w + xx / up) * cin : zeros;
                }
              }
              for (size_t c0 = 0; c0 < cin; c0 += kWinogradChunk)
                winograd_input_tile(d, c0, std::min(kWinogradChunk, cin - c0), v + t * cin, block * cin);
            }
          });
          const int rows = static_cast<int>(nt), ni = static_cast<int>(cin), no = static_cast<int>(cout);
          if (auto batch = blas_sgemm_batch_strided(); batch != nullptr) {
            batch(kRowMajor, kNoTrans, kNoTrans, rows, no, ni, 1.0f, v, ni, static_cast<int>(block * cin), u, no,
                  static_cast<int>(cin * cout), 0.0f, m, no, static_cast<int>(block * cout), kProducts);
          } else {
            for (size_t xi = 0; xi < kProducts; ++xi) {
              sgemm(kRowMajor, kNoTrans, kNoTrans, rows, no, ni, 1.0f, v + xi * block * cin, ni, u + xi * cin * cout,
                    no, 0.0f, m + xi * block * cout, no);
            }
          }
          parallel_for(nt, 64 * cout, [&](size_t b0, size_t b1, size_t) {
            for (size_t t = b0; t < b1; ++t) {
              const size_t ty = (t0 + t) / tiles_w, tx = (t0 + t) % tiles_w;
              float* y[kTile][kTile];
              const float* r[kTile][kTile];
              for (size_t a = 0; a < kTile; ++a) {
                for (size_t c = 0; c < kTile; ++c) {
                  const size_t row = kTile * ty + a, col = kTile * tx + c, at = (row * wd + col) * cout;
                  const bool inside = row < h && col < wd;
                  y[a][c] = inside ? result + at : nullptr;
                  r[a][c] = inside && residual != nullptr ? residual + at : nullptr;
                }
              }
              for (size_t o0 = 0; o0 < cout; o0 += kWinogradChunk)
                winograd_output_tile(m + t * cout, block * cout, b, o0, std::min(kWinogradChunk, cout - o0), y, r);
            }
          });
        }
      }
    });
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto o = dynamic_cast<const CpuWinogradConv3x3*>(&other);
    return o != nullptr && o->upsample_ == upsample_;
  }

 private:
  Sgemm sgemm_;
  int upsample_;
};

}  // namespace

namespace mlxs {

mx::array conv2d(const mx::array& x, const mx::array& weight, const mx::array& bias, int k, int stride, int pad_lo,
                 int pad_hi) {
  if (x.ndim() != 4 || weight.ndim() != 2 || k < 1 || weight.shape(0) != k * k * x.shape(3) ||
      bias.size() != static_cast<size_t>(weight.shape(1))) {
    throw std::invalid_argument("[conv2d] expects NHWC input, a [k·k·I, O] weight and O biases");
  }
  if (stride < 1 || pad_lo < 0 || pad_hi < 0 || pad_lo >= k || pad_hi >= k) {
    throw std::invalid_argument("[conv2d] expects a positive stride and padding below the kernel size");
  }
  const int oh = (x.shape(1) + pad_lo + pad_hi - k) / stride + 1, ow = (x.shape(2) + pad_lo + pad_hi - k) / stride + 1;
  if (x.shape(1) + pad_lo + pad_hi < k || x.shape(2) + pad_lo + pad_hi < k) {
    throw std::invalid_argument("[conv2d] the padded input is smaller than the kernel");
  }
  const int cin = x.shape(3), cout = weight.shape(1);
  auto stream = mx::default_stream(mx::default_device());
  const Sgemm sgemm = blas_sgemm();
  if (sgemm != nullptr && stream.device == mx::Device::cpu && x.dtype() == mx::float32 &&
      weight.dtype() == mx::float32 && bias.dtype() == mx::float32) {
    // Winograd's tiles cover the output a stride-1 "same" 3×3 convolution has.
    const bool winograd = k == 3 && stride == 1 && pad_lo == 1 && pad_hi == 1;
    std::shared_ptr<mx::Primitive> primitive;
    if (winograd) {
      primitive = std::make_shared<CpuWinogradConv3x3>(stream, sgemm, 1);
    } else {
      primitive = std::make_shared<CpuConv2d>(stream, k, stride, pad_lo, sgemm);
    }
    return mx::array({x.shape(0), oh, ow, cout}, mx::float32, std::move(primitive),
                     {mx::contiguous(x), mx::contiguous(weight), mx::contiguous(mx::reshape(bias, {cout}))});
  }
  // Elsewhere MLX's own convolution, with the weight back in its [O, k, k, I] layout.
  auto w = mx::transpose(mx::reshape(weight, {k, k, cin, cout}), {3, 0, 1, 2});
  return mx::add(mx::conv_general(x, w, std::vector<int>{stride, stride}, std::vector<int>{pad_lo, pad_lo},
                                  std::vector<int>{pad_hi, pad_hi}, std::vector<int>{1, 1}, std::vector<int>{1, 1}),
                 mx::reshape(bias, {cout}));
}

mx::array conv3x3_same(const mx::array& x, const mx::array& weight, const mx::array& bias, int upsample,
                       const std::optional<mx::array>& residual) {
  if (upsample != 1 && upsample != 2) throw std::invalid_argument("[conv3x3_same] upsamples by 1 or 2");
  if (x.ndim() != 4) throw std::invalid_argument("[conv3x3_same] expects NHWC input");
  const mx::Shape shape = {x.shape(0), x.shape(1) * upsample, x.shape(2) * upsample,
                           weight.ndim() == 2 ? weight.shape(1) : 0};
  if (residual && residual->shape() != shape) {
    throw std::invalid_argument("[conv3x3_same] the residual must be shaped as the output");
  }
  auto stream = mx::default_stream(mx::default_device());
  const Sgemm sgemm = blas_sgemm();
  const bool fused = sgemm != nullptr && stream.device == mx::Device::cpu && x.dtype() == mx::float32 &&
                     weight.dtype() == mx::float32 && bias.dtype() == mx::float32 &&
                     (!residual || residual->dtype() == mx::float32);
  if (!fused) {
    // The same steps one by one: the enlarged copy, the convolution, the add.
    auto input = x;
    if (upsample == 2) {
      const int b = x.shape(0), h = x.shape(1), w = x.shape(2), c = x.shape(3);
      input = mx::reshape(mx::broadcast_to(mx::reshape(x, {b, h, 1, w, 1, c}), {b, h, 2, w, 2, c}),
                          {b, 2 * h, 2 * w, c});
    }
    auto y = conv2d(input, weight, bias, 3, 1, 1, 1);
    return residual ? mx::add(y, *residual) : y;
  }
  if (weight.ndim() != 2 || weight.shape(0) != 9 * x.shape(3) || bias.size() != static_cast<size_t>(weight.shape(1))) {
    throw std::invalid_argument("[conv3x3_same] expects a [9·I, O] weight and O biases");
  }
  std::vector<mx::array> inputs = {mx::contiguous(x), mx::contiguous(weight),
                                   mx::contiguous(mx::reshape(bias, {weight.shape(1)}))};
  if (residual) inputs.push_back(mx::contiguous(*residual));
  return mx::array(shape, mx::float32, std::make_shared<CpuWinogradConv3x3>(stream, sgemm, upsample),
                   std::move(inputs));
}

}  // namespace mlxs
