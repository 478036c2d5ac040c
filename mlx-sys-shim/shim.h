/* mlx-sys-shim: a small C ABI over MLX's C++ API, for zimage's Rust bindings.
 *
 * Conventions (one for every function):
 *   - results come back through out-pointers; the return value is a status: 0 ok, 1 failure;
 *   - on failure the C++ exception's message is kept per thread, read it with mlxs_last_error();
 *   - no function lets a C++ exception escape, and none ever exits the process;
 *   - every mlxs_array* handed out is owned by the caller and freed with mlxs_array_free.
 * Names follow mlx::core (mlxs_matmul wraps mlx::core::matmul), fast kernels are mlxs_fast_*.
 * Dtype codes are mlx::core::Dtype::Val in declaration order (see MLXS_* below).
 */
#ifndef MLX_SYS_SHIM_H
#define MLX_SYS_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mlxs_array mlxs_array;

enum {
  MLXS_BOOL = 0, MLXS_UINT8, MLXS_UINT16, MLXS_UINT32, MLXS_UINT64,
  MLXS_INT8, MLXS_INT16, MLXS_INT32, MLXS_INT64,
  MLXS_FLOAT16, MLXS_FLOAT32, MLXS_FLOAT64, MLXS_BFLOAT16, MLXS_COMPLEX64
};

/* Errors and library facts */
const char* mlxs_last_error(void);
const char* mlxs_version(void);
int mlxs_set_default_device(int gpu);
int mlxs_default_device_is_gpu(void);
int mlxs_gpu_available(void);

/* Array lifetime and facts */
void mlxs_array_free(mlxs_array* a);
int mlxs_array_clone(mlxs_array** out, const mlxs_array* a);
size_t mlxs_array_ndim(const mlxs_array* a);
const int32_t* mlxs_array_shape(const mlxs_array* a);
int mlxs_array_dtype(const mlxs_array* a);
size_t mlxs_array_size(const mlxs_array* a);
size_t mlxs_array_nbytes(const mlxs_array* a);

/* Creation. from_bytes copies; wrap wraps external memory without a copy where the backend
 * allows and calls deleter(ctx) once MLX no longer needs the memory. With `mapped` set, the memory
 * is read-only (a file mapped into memory) and its 8 bytes before `data` are readable too: on the
 * CPU it is wrapped without a copy wherever it lies (MLX's CPU allocator keeps a buffer's size in
 * the 8 bytes before its data, and no longer than the array lives reads them), and the array
 * never lends its memory to an output. */
int mlxs_array_from_bytes(mlxs_array** out, const void* data, const int32_t* shape, size_t ndim, int dtype);
int mlxs_array_wrap(mlxs_array** out, void* data, const int32_t* shape, size_t ndim, int dtype, int mapped,
                    void (*deleter)(void* ctx), void* ctx);
int mlxs_full(mlxs_array** out, const int32_t* shape, size_t ndim, double value, int dtype);
int mlxs_arange(mlxs_array** out, double start, double stop, double step, int dtype);

/* Evaluation and reading back (to_bytes evaluates and copies row-major bytes into dst). */
int mlxs_eval(mlxs_array* const* xs, size_t n);
int mlxs_to_bytes(const mlxs_array* a, void* dst, size_t dst_len);

/* Unary ops */
#define MLXS_UNARY(name) int mlxs_##name(mlxs_array** out, const mlxs_array* a);
MLXS_UNARY(negative) MLXS_UNARY(exp) MLXS_UNARY(log) MLXS_UNARY(sin) MLXS_UNARY(cos)
MLXS_UNARY(tanh) MLXS_UNARY(sigmoid) MLXS_UNARY(sqrt) MLXS_UNARY(rsqrt) MLXS_UNARY(square)
MLXS_UNARY(abs) MLXS_UNARY(erf) MLXS_UNARY(logical_not)
/* x · sigmoid(x); float32 on the CPU runs a vectorised kernel of the shim's own. */
MLXS_UNARY(silu)
/* torch's GELU(approximate="tanh"), computed in float32 and rounded once; float32 on the CPU
   runs a vectorised kernel of the shim's own on every core. */
MLXS_UNARY(gelu_tanh)
#undef MLXS_UNARY

/* Binary ops (numpy broadcasting) */
#define MLXS_BINARY(name) int mlxs_##name(mlxs_array** out, const mlxs_array* a, const mlxs_array* b);
MLXS_BINARY(add) MLXS_BINARY(subtract) MLXS_BINARY(multiply) MLXS_BINARY(divide)
MLXS_BINARY(maximum) MLXS_BINARY(minimum) MLXS_BINARY(power)
MLXS_BINARY(equal) MLXS_BINARY(not_equal) MLXS_BINARY(less) MLXS_BINARY(less_equal)
MLXS_BINARY(greater) MLXS_BINARY(greater_equal) MLXS_BINARY(logical_and) MLXS_BINARY(logical_or)
MLXS_BINARY(matmul)
#undef MLXS_BINARY

int mlxs_where(mlxs_array** out, const mlxs_array* cond, const mlxs_array* a, const mlxs_array* b);
/* lo/hi may be null (no bound) */
int mlxs_clip(mlxs_array** out, const mlxs_array* a, const mlxs_array* lo, const mlxs_array* hi);
int mlxs_addmm(mlxs_array** out, const mlxs_array* c, const mlxs_array* a, const mlxs_array* b, float alpha, float beta);
int mlxs_astype(mlxs_array** out, const mlxs_array* a, int dtype);
int mlxs_view(mlxs_array** out, const mlxs_array* a, int dtype);

/* Shape ops */
int mlxs_reshape(mlxs_array** out, const mlxs_array* a, const int32_t* shape, size_t ndim);
int mlxs_transpose(mlxs_array** out, const mlxs_array* a, const int32_t* axes, size_t n);
int mlxs_swapaxes(mlxs_array** out, const mlxs_array* a, int axis1, int axis2);
int mlxs_expand_dims(mlxs_array** out, const mlxs_array* a, int axis);
int mlxs_squeeze(mlxs_array** out, const mlxs_array* a, int axis);
int mlxs_broadcast_to(mlxs_array** out, const mlxs_array* a, const int32_t* shape, size_t ndim);
int mlxs_repeat(mlxs_array** out, const mlxs_array* a, int repeats, int axis);
int mlxs_slice(mlxs_array** out, const mlxs_array* a, const int32_t* start, const int32_t* stop,
               const int32_t* strides, size_t ndim);
int mlxs_take(mlxs_array** out, const mlxs_array* a, const mlxs_array* indices, int axis);
int mlxs_take_along_axis(mlxs_array** out, const mlxs_array* a, const mlxs_array* indices, int axis);
int mlxs_concatenate(mlxs_array** out, const mlxs_array* const* xs, size_t n, int axis);
int mlxs_stack(mlxs_array** out, const mlxs_array* const* xs, size_t n, int axis);
/* split into `parts` equal parts, or at `indices` when n_indices > 0; fills outs[0..count) */
int mlxs_split(mlxs_array** outs, size_t max_outs, size_t* count, const mlxs_array* a, int parts,
               const int32_t* indices, size_t n_indices, int axis);
int mlxs_pad(mlxs_array** out, const mlxs_array* a, const int32_t* low, const int32_t* high, size_t ndim,
             float value);

/* Reductions (axes: n == 0 means all axes) */
#define MLXS_REDUCE(name) \
  int mlxs_##name(mlxs_array** out, const mlxs_array* a, const int32_t* axes, size_t n, int keepdims);
MLXS_REDUCE(sum) MLXS_REDUCE(mean) MLXS_REDUCE(max) MLXS_REDUCE(min)
MLXS_REDUCE(argmax)
#undef MLXS_REDUCE
int mlxs_var(mlxs_array** out, const mlxs_array* a, const int32_t* axes, size_t n, int keepdims, int ddof);
int mlxs_softmax(mlxs_array** out, const mlxs_array* a, const int32_t* axes, size_t n, int precise);

/* Convolution: input NHWC, weight [O, kh, kw, I] */
int mlxs_conv2d(mlxs_array** out, const mlxs_array* x, const mlxs_array* w, int stride_h, int stride_w,
                int pad_h, int pad_w, int dil_h, int dil_w, int groups);

/* Quantization (affine mode) */
int mlxs_quantized_matmul(mlxs_array** out, const mlxs_array* x, const mlxs_array* wq,
                          const mlxs_array* scales, const mlxs_array* biases, int transpose,
                          int group_size, int bits);

/* Quantization in any of MLX's modes ("affine", "mxfp4", "mxfp8", "nvfp4"); *biases is set to
 * null for the modes that have none. dequantize_mode's biases may be null. */
int mlxs_quantize_mode(mlxs_array** wq, mlxs_array** scales, mlxs_array** biases, const mlxs_array* w,
                       int group_size, int bits, const char* mode);
int mlxs_dequantize_mode(mlxs_array** out, const mlxs_array* wq, const mlxs_array* scales,
                         const mlxs_array* biases, int group_size, int bits, const char* mode);

/* y = x · Wᵀ (+ bias) with W [N, K] kept as stored: dense (scales null) in any float dtype, or
 * quantized in `mode` (packed uint32 w, scales, biases where the mode has them; null mode means
 * "affine"). bias may be null. On the CPU with float32 x, bf16/f16 and affine weights are widened
 * a tile at a time and multiplied by sgemm; with bf16_products != 0, on a CPU with AVX512-BF16,
 * every weight form is packed in bf16 and multiplied with bf16 inputs and float32 sums. */
int mlxs_fast_linear(mlxs_array** out, const mlxs_array* x, const mlxs_array* w, const mlxs_array* scales,
                     const mlxs_array* biases, const mlxs_array* bias, int group_size, int bits,
                     const char* mode, int bf16_products);
/* 1 when this CPU can run bf16 products (AVX512-BF16), else 0. */
int mlxs_bf16_products_available(void);

/* Fast kernels; weight/bias/freqs/mask may be null */
int mlxs_fast_rms_norm(mlxs_array** out, const mlxs_array* x, const mlxs_array* weight, float eps);
/* GroupNorm over [B, ..., C] (consecutive channels per group), then SiLU when silu != 0. */
int mlxs_fast_group_norm(mlxs_array** out, const mlxs_array* x, const mlxs_array* weight, const mlxs_array* bias,
                         int groups, float eps, int silu);
/* Convolution of NHWC x by a k×k kernel given as a [k·k·I, O] matrix, plus bias: a stride, and
 * pad_lo zero rows and columns before the input, pad_hi after. */
int mlxs_fast_conv2d(mlxs_array** out, const mlxs_array* x, const mlxs_array* weight, const mlxs_array* bias, int k,
                     int stride, int pad_lo, int pad_hi);
/* The stride-1 "same" 3×3 convolution (weight a [9·I, O] matrix) of x enlarged `upsample` (1 or
 * 2) times by nearest neighbour, plus residual (shaped as the output; may be null). */
int mlxs_fast_conv3x3_same(mlxs_array** out, const mlxs_array* x, const mlxs_array* weight, const mlxs_array* bias,
                           int upsample, const mlxs_array* residual);
/* RMS norm of the last axis times weight, plus residual (shaped as x) when not null: on the CPU in
 * float32 one pass on every core. */
int mlxs_fast_rms_norm_residual(mlxs_array** out, const mlxs_array* x, const mlxs_array* weight, float eps,
                                const mlxs_array* residual);
/* The transformer's attention from fused q|k|v projections [S, 3·heads·D]: q and k RMS-normed per head
 * (weights of D values) and rotated by RoPE's interleaved pairs (cos, sin: S·D/2 angles), q times
 * q_scale. attend = 0: the heads [3, heads, S, D]; attend = 1: their unmasked attention
 * [S, heads·D] in one step. attention_rows: the attention of [3, heads, S, D] (q already scaled). */
int mlxs_fast_qkv(mlxs_array** out, const mlxs_array* qkv, const mlxs_array* q_weight, const mlxs_array* k_weight,
                  const mlxs_array* cos, const mlxs_array* sin, int heads, float eps, float q_scale, int attend);
int mlxs_fast_attention_rows(mlxs_array** out, const mlxs_array* qkv);
/* [..., 2F] → [..., F]: SiLU of the first half of the last axis times the second half. */
int mlxs_fast_silu_gate(mlxs_array** out, const mlxs_array* x);
int mlxs_fast_layer_norm(mlxs_array** out, const mlxs_array* x, const mlxs_array* weight,
                         const mlxs_array* bias, float eps);
int mlxs_fast_rope(mlxs_array** out, const mlxs_array* x, int dims, int traditional, int has_base,
                   float base, float scale, int offset, const mlxs_array* freqs);
/* mask_mode: "" (none, or an array mask when mask != null) or "causal" */
int mlxs_fast_scaled_dot_product_attention(mlxs_array** out, const mlxs_array* q, const mlxs_array* k,
                                           const mlxs_array* v, float scale, const char* mask_mode,
                                           const mlxs_array* mask);

/* Random */
int mlxs_random_key(mlxs_array** out, uint64_t seed);
int mlxs_random_normal(mlxs_array** out, const int32_t* shape, size_t ndim, int dtype, const mlxs_array* key);

/* Safetensors I/O. load returns parallel arrays of names and handles; free the names with
 * mlxs_free_strings and each array with mlxs_array_free. */
int mlxs_load_safetensors(const char* path, char*** names, mlxs_array*** arrays, size_t* n_arrays,
                          char*** meta_keys, char*** meta_values, size_t* n_meta);
int mlxs_save_safetensors(const char* path, const char* const* names, const mlxs_array* const* arrays,
                          size_t n, const char* const* meta_keys, const char* const* meta_values, size_t n_meta);
void mlxs_free_strings(char** strings, size_t n);
void mlxs_free_array_list(mlxs_array** arrays);

/* Memory statistics (bytes) */
size_t mlxs_get_active_memory(void);
size_t mlxs_get_peak_memory(void);
size_t mlxs_get_cache_memory(void);
void mlxs_reset_peak_memory(void);
void mlxs_clear_cache(void);
/* MLX's limit on its allocations, and the previous value of a limit that is set. */
size_t mlxs_get_memory_limit(void);
size_t mlxs_set_cache_limit(size_t limit);
size_t mlxs_set_wired_limit(size_t limit);
/* The memory of the GPU MLX runs on: Metal's recommended working set, a CUDA device's total
 * memory; 0 without a GPU. */
size_t mlxs_device_memory(void);

/* BLAS: a description of the library that serves cblas_sgemm for MLX, and a direct call of
 * that sgemm (row-major, no transposes) used as the benchmark's baseline. */
const char* mlxs_blas_description(void);
int mlxs_blas_sgemm(int m, int n, int k, const float* a, const float* b, float* c);
/* The process-wide cblas_sgemm (the one MLX calls), or NULL: for the shim's own CPU kernels. */
void* mlxs_sgemm_symbol(void);

#ifdef __cplusplus
}
#endif

#endif
