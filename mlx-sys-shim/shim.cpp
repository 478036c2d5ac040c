// mlx-sys-shim: the C ABI declared in shim.h, over mlx::core.
//
// Every entry point runs its body through `guard`, which turns any C++ exception into a status
// of 1 and a per-thread message, so nothing unwinds into Rust and nothing exits the process.

#include "shim.h"

#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "mlx/mlx.h"
#include "cpu_kernels.h"

namespace mx = mlx::core;

struct mlxs_array {
  mx::array a;
};

namespace {

thread_local std::string last_error;

template <typename F>
int guard(F&& body) {
  try {
    body();
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown C++ exception";
  }
  return 1;
}

mx::Dtype to_dtype(int code) {
  switch (code) {
    case MLXS_BOOL: return mx::bool_;
    case MLXS_UINT8: return mx::uint8;
    case MLXS_UINT16: return mx::uint16;
    case MLXS_UINT32: return mx::uint32;
    case MLXS_UINT64: return mx::uint64;
    case MLXS_INT8: return mx::int8;
    case MLXS_INT16: return mx::int16;
    case MLXS_INT32: return mx::int32;
    case MLXS_INT64: return mx::int64;
    case MLXS_FLOAT16: return mx::float16;
    case MLXS_FLOAT32: return mx::float32;
    case MLXS_FLOAT64: return mx::float64;
    case MLXS_BFLOAT16: return mx::bfloat16;
    case MLXS_COMPLEX64: return mx::complex64;
  }
  throw std::invalid_argument("[mlxs] unknown dtype code " + std::to_string(code));
}

int from_dtype(mx::Dtype d) {
  return static_cast<int>(d.val());
}

mx::Shape to_shape(const int32_t* dims, size_t n) {
  return mx::Shape(dims, dims + n);
}

std::vector<int> to_axes(const int32_t* axes, size_t n) {
  return std::vector<int>(axes, axes + n);
}

void put(mlxs_array** out, mx::array a) {
  *out = new mlxs_array{std::move(a)};
}

std::optional<mx::array> opt(const mlxs_array* a) {
  if (a == nullptr) return std::nullopt;
  return a->a;
}

std::vector<mx::array> to_vector(const mlxs_array* const* xs, size_t n) {
  std::vector<mx::array> v;
  v.reserve(n);
  for (size_t i = 0; i < n; ++i) v.push_back(xs[i]->a);
  return v;
}

char* dup_string(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p == nullptr) throw std::bad_alloc();
  std::memcpy(p, s.c_str(), s.size() + 1);
  return p;
}

}  // namespace

extern "C" {

const char* mlxs_last_error(void) { return last_error.c_str(); }

const char* mlxs_version(void) { return mx::version(); }

int mlxs_set_default_device(int gpu) {
  return guard([&] { mx::set_default_device(gpu ? mx::Device::gpu : mx::Device::cpu); });
}

int mlxs_default_device_is_gpu(void) {
  return mx::default_device() == mx::Device::gpu ? 1 : 0;
}

int mlxs_gpu_available(void) {
  try {
    return mx::is_available(mx::Device::gpu) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

void mlxs_array_free(mlxs_array* a) { delete a; }

int mlxs_array_clone(mlxs_array** out, const mlxs_array* a) {
  return guard([&] { put(out, a->a); });
}

size_t mlxs_array_ndim(const mlxs_array* a) { return a->a.ndim(); }
const int32_t* mlxs_array_shape(const mlxs_array* a) { return a->a.shape().data(); }
int mlxs_array_dtype(const mlxs_array* a) { return from_dtype(a->a.dtype()); }
size_t mlxs_array_size(const mlxs_array* a) { return a->a.size(); }
size_t mlxs_array_nbytes(const mlxs_array* a) { return a->a.nbytes(); }

int mlxs_array_from_bytes(mlxs_array** out, const void* data, const int32_t* shape, size_t ndim, int dtype) {
  return guard([&] {
    auto dt = to_dtype(dtype);
    auto sh = to_shape(shape, ndim);
    size_t numel = 1;
    for (auto d : sh) numel *= static_cast<size_t>(d);
    size_t nbytes = numel * mx::size_of(dt);
    // Copy the raw bytes as uint8, then reinterpret: this keeps every dtype (bf16 included)
    // bit-exact without a per-element conversion.
    auto bytes = static_cast<const uint8_t*>(data);
    mx::array raw(bytes, mx::Shape{static_cast<int>(nbytes)}, mx::uint8);
    auto typed = (dt == mx::uint8) ? raw : mx::view(raw, dt);
    put(out, mx::reshape(typed, sh));
  });
}

static int wrap_external(mlxs_array** out, void* data, const int32_t* shape, size_t ndim, int dtype,
                         void (*deleter)(void*), void* ctx) {
  // If the array constructor throws before taking the deleter, release the memory here so the
  // caller's owner is dropped exactly once either way.
  bool handed_over = false;
  int status = guard([&] {
    auto dt = to_dtype(dtype);
    auto sh = to_shape(shape, ndim);
    handed_over = true;
    put(out, mx::array(data, sh, dt, [deleter, ctx](void*) { deleter(ctx); }));
  });
  if (status != 0 && !handed_over) deleter(ctx);
  return status;
}

// Whether MLX's allocator is the CPU one that keeps each buffer's size in the 8 bytes before
// its data (raw_ptr = buffer + 8): then any readable memory can be wrapped as a buffer that
// starts 8 bytes earlier, where a GPU allocator would need its own kind of buffer.
static bool size_prefixed_buffers() {
  static const bool yes = [] {
    auto probe = mx::allocator::malloc(16);
    auto b = probe.buffer();
    return b.ptr() != nullptr && b.raw_ptr() == static_cast<char*>(b.ptr()) + sizeof(size_t) &&
           mx::allocator::allocator().size(b) == 16;
  }();
  return yes;
}

int mlxs_array_wrap(mlxs_array** out, void* data, const int32_t* shape, size_t ndim, int dtype, int mapped,
                    void (*deleter)(void*), void* ctx) {
  if (!mapped || !size_prefixed_buffers()) return wrap_external(out, data, shape, ndim, dtype, deleter, ctx);
  bool handed_over = false;
  int status = guard([&] {
    auto dt = to_dtype(dtype);
    auto sh = to_shape(shape, ndim);
    auto buffer = mx::allocator::Buffer(static_cast<char*>(data) - sizeof(size_t));
    // A Data made with a deleter is not owned by the allocator: MLX neither frees nor donates it.
    mx::allocator::Data owner(buffer, [deleter, ctx](mx::allocator::Buffer) { deleter(ctx); });
    handed_over = true;
    put(out, mx::array(std::move(owner), sh, dt));
  });
  if (status != 0 && !handed_over) deleter(ctx);
  return status;
}

int mlxs_full(mlxs_array** out, const int32_t* shape, size_t ndim, double value, int dtype) {
  return guard([&] {
    auto dt = to_dtype(dtype);
    put(out, mx::full(to_shape(shape, ndim), mx::array(value, mx::float64 == dt ? mx::float64 : mx::float32), dt));
  });
}

int mlxs_arange(mlxs_array** out, double start, double stop, double step, int dtype) {
  return guard([&] { put(out, mx::arange(start, stop, step, to_dtype(dtype))); });
}

int mlxs_eval(mlxs_array* const* xs, size_t n) {
  return guard([&] {
    std::vector<mx::array> v;
    v.reserve(n);
    for (size_t i = 0; i < n; ++i) v.push_back(xs[i]->a);
    mx::eval(v);
  });
}

int mlxs_to_bytes(const mlxs_array* a, void* dst, size_t dst_len) {
  return guard([&] {
    auto c = mx::contiguous(a->a);
    c.eval();
    if (c.nbytes() != dst_len) {
      throw std::invalid_argument("[to_bytes] destination holds " + std::to_string(dst_len) +
                                  " bytes, array has " + std::to_string(c.nbytes()));
    }
    if (dst_len > 0) std::memcpy(dst, c.data<uint8_t>(), dst_len);
  });
}

#define MLXS_UNARY_IMPL(name, expr)                                   \
  int mlxs_##name(mlxs_array** out, const mlxs_array* a) {            \
    return guard([&] { put(out, expr(a->a)); });                      \
  }
MLXS_UNARY_IMPL(negative, mx::negative)
MLXS_UNARY_IMPL(exp, mx::exp)
MLXS_UNARY_IMPL(log, mx::log)
MLXS_UNARY_IMPL(sin, mx::sin)
MLXS_UNARY_IMPL(cos, mx::cos)
MLXS_UNARY_IMPL(tanh, mx::tanh)
MLXS_UNARY_IMPL(sigmoid, mx::sigmoid)
MLXS_UNARY_IMPL(sqrt, mx::sqrt)
MLXS_UNARY_IMPL(rsqrt, mx::rsqrt)
MLXS_UNARY_IMPL(square, mx::square)
MLXS_UNARY_IMPL(abs, mx::abs)
MLXS_UNARY_IMPL(erf, mx::erf)
MLXS_UNARY_IMPL(logical_not, mx::logical_not)
MLXS_UNARY_IMPL(silu, mlxs::silu)
MLXS_UNARY_IMPL(gelu_tanh, mlxs::gelu_tanh)

#define MLXS_BINARY_IMPL(name)                                                     \
  int mlxs_##name(mlxs_array** out, const mlxs_array* a, const mlxs_array* b) {    \
    return guard([&] { put(out, mx::name(a->a, b->a)); });                         \
  }
MLXS_BINARY_IMPL(add)
MLXS_BINARY_IMPL(subtract)
MLXS_BINARY_IMPL(multiply)
MLXS_BINARY_IMPL(divide)
MLXS_BINARY_IMPL(maximum)
MLXS_BINARY_IMPL(minimum)
MLXS_BINARY_IMPL(power)
MLXS_BINARY_IMPL(equal)
MLXS_BINARY_IMPL(not_equal)
MLXS_BINARY_IMPL(less)
MLXS_BINARY_IMPL(less_equal)
MLXS_BINARY_IMPL(greater)
MLXS_BINARY_IMPL(greater_equal)
MLXS_BINARY_IMPL(logical_and)
MLXS_BINARY_IMPL(logical_or)
MLXS_BINARY_IMPL(matmul)

int mlxs_where(mlxs_array** out, const mlxs_array* cond, const mlxs_array* a, const mlxs_array* b) {
  return guard([&] { put(out, mx::where(cond->a, a->a, b->a)); });
}

int mlxs_clip(mlxs_array** out, const mlxs_array* a, const mlxs_array* lo, const mlxs_array* hi) {
  return guard([&] { put(out, mx::clip(a->a, opt(lo), opt(hi))); });
}

int mlxs_addmm(mlxs_array** out, const mlxs_array* c, const mlxs_array* a, const mlxs_array* b, float alpha,
               float beta) {
  return guard([&] { put(out, mx::addmm(c->a, a->a, b->a, alpha, beta)); });
}

int mlxs_astype(mlxs_array** out, const mlxs_array* a, int dtype) {
  return guard([&] { put(out, mx::astype(a->a, to_dtype(dtype))); });
}

int mlxs_view(mlxs_array** out, const mlxs_array* a, int dtype) {
  return guard([&] { put(out, mx::view(a->a, to_dtype(dtype))); });
}

int mlxs_reshape(mlxs_array** out, const mlxs_array* a, const int32_t* shape, size_t ndim) {
  return guard([&] { put(out, mx::reshape(a->a, to_shape(shape, ndim))); });
}

int mlxs_transpose(mlxs_array** out, const mlxs_array* a, const int32_t* axes, size_t n) {
  return guard([&] { put(out, mx::transpose(a->a, to_axes(axes, n))); });
}

int mlxs_swapaxes(mlxs_array** out, const mlxs_array* a, int axis1, int axis2) {
  return guard([&] { put(out, mx::swapaxes(a->a, axis1, axis2)); });
}

int mlxs_expand_dims(mlxs_array** out, const mlxs_array* a, int axis) {
  return guard([&] { put(out, mx::expand_dims(a->a, axis)); });
}

int mlxs_squeeze(mlxs_array** out, const mlxs_array* a, int axis) {
  return guard([&] { put(out, mx::squeeze(a->a, axis)); });
}

int mlxs_broadcast_to(mlxs_array** out, const mlxs_array* a, const int32_t* shape, size_t ndim) {
  return guard([&] { put(out, mx::broadcast_to(a->a, to_shape(shape, ndim))); });
}

int mlxs_repeat(mlxs_array** out, const mlxs_array* a, int repeats, int axis) {
  return guard([&] { put(out, mx::repeat(a->a, repeats, axis)); });
}

int mlxs_slice(mlxs_array** out, const mlxs_array* a, const int32_t* start, const int32_t* stop,
               const int32_t* strides, size_t ndim) {
  return guard([&] {
    put(out, mx::slice(a->a, to_shape(start, ndim), to_shape(stop, ndim), to_shape(strides, ndim)));
  });
}

int mlxs_take(mlxs_array** out, const mlxs_array* a, const mlxs_array* indices, int axis) {
  return guard([&] { put(out, mx::take(a->a, indices->a, axis)); });
}

int mlxs_take_along_axis(mlxs_array** out, const mlxs_array* a, const mlxs_array* indices, int axis) {
  return guard([&] { put(out, mx::take_along_axis(a->a, indices->a, axis)); });
}

int mlxs_concatenate(mlxs_array** out, const mlxs_array* const* xs, size_t n, int axis) {
  return guard([&] { put(out, mx::concatenate(to_vector(xs, n), axis)); });
}

int mlxs_stack(mlxs_array** out, const mlxs_array* const* xs, size_t n, int axis) {
  return guard([&] { put(out, mx::stack(to_vector(xs, n), axis)); });
}

int mlxs_split(mlxs_array** outs, size_t max_outs, size_t* count, const mlxs_array* a, int parts,
               const int32_t* indices, size_t n_indices, int axis) {
  return guard([&] {
    auto pieces = n_indices > 0 ? mx::split(a->a, to_shape(indices, n_indices), axis)
                                : mx::split(a->a, parts, axis);
    if (pieces.size() > max_outs) {
      throw std::invalid_argument("[split] more pieces than the caller made room for");
    }
    for (size_t i = 0; i < pieces.size(); ++i) put(&outs[i], pieces[i]);
    *count = pieces.size();
  });
}

int mlxs_pad(mlxs_array** out, const mlxs_array* a, const int32_t* low, const int32_t* high, size_t ndim,
             float value) {
  return guard([&] {
    std::vector<int> axes(ndim);
    for (size_t i = 0; i < ndim; ++i) axes[i] = static_cast<int>(i);
    put(out, mx::pad(a->a, axes, to_shape(low, ndim), to_shape(high, ndim), mx::array(value, a->a.dtype())));
  });
}

#define MLXS_REDUCE_IMPL(name)                                                                     \
  int mlxs_##name(mlxs_array** out, const mlxs_array* a, const int32_t* axes, size_t n, int keepdims) { \
    return guard([&] {                                                                             \
      if (n == 0) {                                                                                \
        put(out, mx::name(a->a, keepdims != 0));                                                   \
      } else {                                                                                     \
        put(out, mx::name(a->a, to_axes(axes, n), keepdims != 0));                                 \
      }                                                                                            \
    });                                                                                            \
  }
MLXS_REDUCE_IMPL(sum)
MLXS_REDUCE_IMPL(mean)
MLXS_REDUCE_IMPL(max)
MLXS_REDUCE_IMPL(min)

int mlxs_argmax(mlxs_array** out, const mlxs_array* a, const int32_t* axes, size_t n, int keepdims) {
  return guard([&] {
    if (n > 1) throw std::invalid_argument("[argmax] takes at most one axis");
    put(out, n == 0 ? mx::argmax(a->a, keepdims != 0) : mx::argmax(a->a, axes[0], keepdims != 0));
  });
}

int mlxs_var(mlxs_array** out, const mlxs_array* a, const int32_t* axes, size_t n, int keepdims, int ddof) {
  return guard([&] {
    if (n == 0) {
      put(out, mx::var(a->a, keepdims != 0, ddof));
    } else {
      put(out, mx::var(a->a, to_axes(axes, n), keepdims != 0, ddof));
    }
  });
}

int mlxs_softmax(mlxs_array** out, const mlxs_array* a, const int32_t* axes, size_t n, int precise) {
  return guard([&] {
    if (n == 0) {
      put(out, mx::softmax(a->a, precise != 0));
    } else {
      put(out, mx::softmax(a->a, to_axes(axes, n), precise != 0));
    }
  });
}

int mlxs_conv2d(mlxs_array** out, const mlxs_array* x, const mlxs_array* w, int stride_h, int stride_w,
                int pad_h, int pad_w, int dil_h, int dil_w, int groups) {
  return guard([&] {
    put(out, mx::conv2d(x->a, w->a, {stride_h, stride_w}, {pad_h, pad_w}, {dil_h, dil_w}, groups));
  });
}

int mlxs_quantized_matmul(mlxs_array** out, const mlxs_array* x, const mlxs_array* wq, const mlxs_array* scales,
                          const mlxs_array* biases, int transpose, int group_size, int bits) {
  return guard([&] {
    put(out, mx::quantized_matmul(x->a, wq->a, scales->a, opt(biases), transpose != 0, group_size, bits,
                                  "affine"));
  });
}

int mlxs_quantize_mode(mlxs_array** wq, mlxs_array** scales, mlxs_array** biases, const mlxs_array* w,
                       int group_size, int bits, const char* mode) {
  return guard([&] {
    const std::string m = mode ? mode : "affine";
    if (m == "symmetric") throw std::invalid_argument("[quantize] symmetric weights come from GGUF files, MLX makes none");
    auto parts = mx::quantize(w->a, group_size, bits, m);
    put(wq, parts.at(0));
    put(scales, parts.at(1));
    if (parts.size() > 2) {
      put(biases, parts[2]);
    } else {
      *biases = nullptr;
    }
  });
}

int mlxs_dequantize_mode(mlxs_array** out, const mlxs_array* wq, const mlxs_array* scales,
                         const mlxs_array* biases, int group_size, int bits, const char* mode) {
  return guard([&] {
    put(out, mlxs::dequantize(wq->a, scales->a, opt(biases), group_size, bits, mode ? mode : "affine"));
  });
}

int mlxs_fast_linear(mlxs_array** out, const mlxs_array* x, const mlxs_array* w, const mlxs_array* scales,
                     const mlxs_array* biases, const mlxs_array* bias, int group_size, int bits,
                     const char* mode, int bf16_products) {
  return guard([&] {
    put(out, mlxs::linear(x->a, w->a, opt(scales), opt(biases), opt(bias), group_size, bits,
                          mode ? mode : "affine", bf16_products != 0));
  });
}

int mlxs_bf16_products_available(void) { return mlxs::bf16_products_available() ? 1 : 0; }

int mlxs_fast_rms_norm(mlxs_array** out, const mlxs_array* x, const mlxs_array* weight, float eps) {
  return guard([&] {
    put(out, weight ? mlxs::rms_norm(x->a, weight->a, eps, std::nullopt) : mx::fast::rms_norm(x->a, std::nullopt, eps));
  });
}

int mlxs_fast_rms_norm_residual(mlxs_array** out, const mlxs_array* x, const mlxs_array* weight, float eps,
                                const mlxs_array* residual) {
  return guard([&] { put(out, mlxs::rms_norm(x->a, weight->a, eps, opt(residual))); });
}

int mlxs_fast_qkv(mlxs_array** out, const mlxs_array* qkv, const mlxs_array* q_weight, const mlxs_array* k_weight,
                  const mlxs_array* cos, const mlxs_array* sin, int heads, float eps, float q_scale, int attend) {
  return guard([&] {
    const auto step = attend ? mlxs::qkv_attention : mlxs::qkv_heads;
    put(out, step(qkv->a, q_weight->a, k_weight->a, cos->a, sin->a, heads, eps, q_scale));
  });
}

int mlxs_fast_attention_rows(mlxs_array** out, const mlxs_array* qkv) {
  return guard([&] { put(out, mlxs::attention_rows(qkv->a)); });
}

int mlxs_fast_silu_gate(mlxs_array** out, const mlxs_array* x) {
  return guard([&] { put(out, mlxs::silu_gate(x->a)); });
}

int mlxs_fast_group_norm(mlxs_array** out, const mlxs_array* x, const mlxs_array* weight, const mlxs_array* bias,
                         int groups, float eps, int silu) {
  return guard([&] { put(out, mlxs::group_norm(x->a, weight->a, bias->a, groups, eps, silu != 0)); });
}

int mlxs_fast_conv2d(mlxs_array** out, const mlxs_array* x, const mlxs_array* weight, const mlxs_array* bias, int k,
                     int stride, int pad_lo, int pad_hi) {
  return guard([&] { put(out, mlxs::conv2d(x->a, weight->a, bias->a, k, stride, pad_lo, pad_hi)); });
}

int mlxs_fast_conv3x3_same(mlxs_array** out, const mlxs_array* x, const mlxs_array* weight, const mlxs_array* bias,
                           int upsample, const mlxs_array* residual) {
  return guard([&] { put(out, mlxs::conv3x3_same(x->a, weight->a, bias->a, upsample, opt(residual))); });
}

int mlxs_fast_layer_norm(mlxs_array** out, const mlxs_array* x, const mlxs_array* weight, const mlxs_array* bias,
                         float eps) {
  return guard([&] { put(out, mx::fast::layer_norm(x->a, opt(weight), opt(bias), eps)); });
}

int mlxs_fast_rope(mlxs_array** out, const mlxs_array* x, int dims, int traditional, int has_base, float base,
                   float scale, int offset, const mlxs_array* freqs) {
  return guard([&] {
    std::optional<float> b = has_base ? std::optional<float>(base) : std::nullopt;
    put(out, mx::fast::rope(x->a, dims, traditional != 0, b, scale, offset, opt(freqs)));
  });
}

int mlxs_fast_scaled_dot_product_attention(mlxs_array** out, const mlxs_array* q, const mlxs_array* k,
                                           const mlxs_array* v, float scale, const char* mask_mode,
                                           const mlxs_array* mask) {
  return guard([&] {
    std::string mode = mask_mode ? mask_mode : "";
    if (mode.empty() || mode == "array" || (mode == "causal" && mask == nullptr)) {
      put(out, mlxs::attention(q->a, k->a, v->a, scale, mode == "causal", opt(mask)));
    } else {
      put(out, mx::fast::scaled_dot_product_attention(q->a, k->a, v->a, scale, mode, opt(mask)));
    }
  });
}

int mlxs_random_key(mlxs_array** out, uint64_t seed) {
  return guard([&] { put(out, mx::random::key(seed)); });
}

int mlxs_random_normal(mlxs_array** out, const int32_t* shape, size_t ndim, int dtype, const mlxs_array* key) {
  return guard([&] {
    put(out, mx::random::normal(to_shape(shape, ndim), to_dtype(dtype), std::nullopt, std::nullopt, opt(key)));
  });
}

int mlxs_load_safetensors(const char* path, char*** names, mlxs_array*** arrays, size_t* n_arrays,
                          char*** meta_keys, char*** meta_values, size_t* n_meta) {
  return guard([&] {
    // MLX's reader runs on the CPU stream: Metal has no GPU kernel for the Load primitive.
    auto [tensors, metadata] = mx::load_safetensors(std::string(path), mx::Device::cpu);
    size_t n = tensors.size();
    auto ns = static_cast<char**>(std::calloc(n + 1, sizeof(char*)));
    auto as = static_cast<mlxs_array**>(std::calloc(n + 1, sizeof(mlxs_array*)));
    auto mk = static_cast<char**>(std::calloc(metadata.size() + 1, sizeof(char*)));
    auto mv = static_cast<char**>(std::calloc(metadata.size() + 1, sizeof(char*)));
    if (!ns || !as || !mk || !mv) {
      std::free(ns), std::free(as), std::free(mk), std::free(mv);
      throw std::bad_alloc();
    }
    size_t i = 0;
    for (auto& [name, arr] : tensors) {
      ns[i] = dup_string(name);
      as[i] = new mlxs_array{arr};
      ++i;
    }
    size_t j = 0;
    for (auto& [k, v] : metadata) {
      mk[j] = dup_string(k);
      mv[j] = dup_string(v);
      ++j;
    }
    *names = ns;
    *arrays = as;
    *n_arrays = n;
    *meta_keys = mk;
    *meta_values = mv;
    *n_meta = metadata.size();
  });
}

int mlxs_save_safetensors(const char* path, const char* const* names, const mlxs_array* const* arrays, size_t n,
                          const char* const* meta_keys, const char* const* meta_values, size_t n_meta) {
  return guard([&] {
    std::unordered_map<std::string, mx::array> tensors;
    for (size_t i = 0; i < n; ++i) tensors.insert_or_assign(names[i], arrays[i]->a);
    std::unordered_map<std::string, std::string> metadata;
    for (size_t i = 0; i < n_meta; ++i) metadata[meta_keys[i]] = meta_values[i];
    mx::save_safetensors(std::string(path), tensors, metadata);
  });
}

void mlxs_free_strings(char** strings, size_t n) {
  if (strings == nullptr) return;
  for (size_t i = 0; i < n; ++i) std::free(strings[i]);
  std::free(strings);
}

void mlxs_free_array_list(mlxs_array** arrays) { std::free(arrays); }

size_t mlxs_get_active_memory(void) { return mx::get_active_memory(); }
size_t mlxs_get_peak_memory(void) { return mx::get_peak_memory(); }
size_t mlxs_get_cache_memory(void) { return mx::get_cache_memory(); }
void mlxs_reset_peak_memory(void) { mx::reset_peak_memory(); }
void mlxs_clear_cache(void) { mx::clear_cache(); }
size_t mlxs_get_memory_limit(void) { return mx::get_memory_limit(); }
size_t mlxs_set_cache_limit(size_t limit) { return mx::set_cache_limit(limit); }
size_t mlxs_set_wired_limit(size_t limit) {
  try {
    return mx::set_wired_limit(limit);
  } catch (const std::exception&) {
    // Above the system's wired limit MLX refuses; the run goes on without wiring.
    return 0;
  }
}

size_t mlxs_device_memory(void) {
  if (mlxs_gpu_available() == 0) return 0;
  try {
    const auto& info = mx::device_info(mx::Device::gpu);
    // Metal's recommended working set first: what the GPU may hold without the system paging;
    // then a CUDA device's free memory (what other processes left), its total where MLX has none.
    for (const char* key : {"max_recommended_working_set_size", "free_memory", "total_memory", "memory_size"}) {
      auto found = info.find(key);
      if (found != info.end() && std::holds_alternative<size_t>(found->second)) {
        return std::get<size_t>(found->second);
      }
    }
  } catch (const std::exception&) {
  }
  return 0;
}

}  // extern "C"
