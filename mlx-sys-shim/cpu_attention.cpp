// Attention kernels: softmax parts for the general attention, and the transformer's attention straight
// from its fused q|k|v projections (qk-norm, RoPE, per-head products).
#include "cpu_common.h"

using namespace mlxs::detail;

namespace {

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

mx::array attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale, bool causal,
                    const std::optional<mx::array>& mask) {
  auto stream = mx::default_stream(mx::default_device());
  auto dtype = q.dtype();
  bool floats = mx::issubdtype(dtype, mx::floating) && dtype != mx::float64 && k.dtype() == dtype && v.dtype() == dtype;
  // An additive float32 mask of [L, S], or [B or 1, H or 1, L, S], on float32 inputs; any other
  // mask (boolean, narrower, other heads) is MLX's to apply.
  bool own_mask = !mask || (mask->dtype() == mx::float32 && dtype == mx::float32 && mask->ndim() >= 2 &&
                            mask->ndim() <= 4 && q.ndim() == 4 && !causal);
  if (!floats || !own_mask || stream.device != mx::Device::cpu || q.ndim() != 4 || q.shape(1) % k.shape(1) != 0 ||
      (causal && q.shape(2) > k.shape(2))) {
    return mx::fast::scaled_dot_product_attention(q, k, v, scale, mask ? "array" : causal ? "causal" : "", mask);
  }
  bool narrow = dtype != mx::float32;
  int batch = q.shape(0), heads = q.shape(1), kv_heads = k.shape(1), len = q.shape(2), keys = k.shape(2);
  int group = heads / kv_heads, dim = q.shape(3);
  // The mask as [B or 1, kvH or 1, group or 1, L, S], broadcast where it is added (never made
  // at the scores' size: a mask shared by the heads stays one [L, S] table).
  std::optional<mx::array> mask5;
  if (mask) {
    auto m = *mask;
    while (m.ndim() < 4) m = mx::expand_dims(m, 0);
    const int mb = m.shape(0), mh = m.shape(1);
    if ((mb != 1 && mb != batch) || (mh != 1 && mh != heads) || m.shape(2) != len || m.shape(3) != keys) {
      return mx::fast::scaled_dot_product_attention(q, k, v, scale, "array", mask);
    }
    mask5 = mh == 1 ? mx::expand_dims(m, 2) : mx::reshape(m, {mb, kv_heads, group, len, keys});
  }
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
    if (mask5) scores = mx::add(scores, mask5->shape(1) == 1 ? *mask5 : pick(*mask5));
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
  auto o = attention(parts[0], parts[1], parts[2], 1.0f, false, std::nullopt);
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

}  // namespace mlxs
