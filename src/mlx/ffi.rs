//! Raw declarations of the `mlx-sys-shim` C ABI (see `mlx-sys-shim/shim.h`).
//!
//! One list serves both ways of reaching the shim: linked into the program (CPU and Metal), the
//! list is an `extern "C"` block; opened at start (`cfg(zimage_dlopen)`, the CUDA variants), each
//! entry is a function of the same name and signature that calls the symbol the opened library
//! holds, looked up once. Callers see no difference.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_void};

#[repr(C)]
pub struct mlxs_array {
    _private: [u8; 0],
}

pub type Out = *mut *mut mlxs_array;
pub type Arr = *const mlxs_array;

/// Declares shim functions, `pub fn name(arg: Type, ...) -> Ret;` each.
#[cfg(not(zimage_dlopen))]
macro_rules! shim_api {
    ($($(#[$meta:meta])* pub fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;)*) => {
        extern "C" {
            $($(#[$meta])* pub fn $name($($arg: $ty),*) $(-> $ret)?;)*
        }
    };
}

/// Declares shim functions, `pub fn name(arg: Type, ...) -> Ret;` each.
#[cfg(zimage_dlopen)]
macro_rules! shim_api {
    ($($(#[$meta:meta])* pub fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;)*) => {
        $(
            $(#[$meta])*
            #[allow(clippy::too_many_arguments, clippy::missing_safety_doc)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) $(-> $ret)? {
                type Entry = unsafe extern "C" fn($($ty),*) $(-> $ret)?;
                static ENTRY: std::sync::OnceLock<Entry> = std::sync::OnceLock::new();
                let entry = *ENTRY.get_or_init(|| {
                    let address = super::runtime::symbol(concat!(stringify!($name), "\0"));
                    // SAFETY: the opened library is the shim built from shim.h together with
                    // this list, so the symbol of this name is a function of this signature.
                    unsafe { std::mem::transmute::<*mut c_void, Entry>(address) }
                });
                // SAFETY: the caller upholds the shim function's contract, as it would calling
                // the linked function.
                unsafe { entry($($arg),*) }
            }
        )*
    };
}

macro_rules! unary { ($($n:ident),*) => { shim_api! { $(pub fn $n(out: Out, a: Arr) -> c_int;)* } } }
macro_rules! binary { ($($n:ident),*) => { shim_api! { $(pub fn $n(out: Out, a: Arr, b: Arr) -> c_int;)* } } }
macro_rules! reduce {
    ($($n:ident),*) => { shim_api! { $(pub fn $n(out: Out, a: Arr, axes: *const i32, n: usize, keepdims: c_int) -> c_int;)* } }
}

unary!(
    mlxs_negative,
    mlxs_exp,
    mlxs_log,
    mlxs_sin,
    mlxs_cos,
    mlxs_tanh,
    mlxs_sigmoid,
    mlxs_sqrt,
    mlxs_rsqrt,
    mlxs_square,
    mlxs_abs,
    mlxs_erf,
    mlxs_logical_not,
    mlxs_silu,
    mlxs_gelu_tanh
);
binary!(
    mlxs_add,
    mlxs_subtract,
    mlxs_multiply,
    mlxs_divide,
    mlxs_maximum,
    mlxs_minimum,
    mlxs_power,
    mlxs_equal,
    mlxs_not_equal,
    mlxs_less,
    mlxs_less_equal,
    mlxs_greater,
    mlxs_greater_equal,
    mlxs_logical_and,
    mlxs_logical_or,
    mlxs_matmul
);
reduce!(mlxs_sum, mlxs_mean, mlxs_max, mlxs_min, mlxs_argmax);

shim_api! {
    pub fn mlxs_last_error() -> *const c_char;
    pub fn mlxs_version() -> *const c_char;
    pub fn mlxs_set_default_device(gpu: c_int) -> c_int;
    pub fn mlxs_default_device_is_gpu() -> c_int;
    pub fn mlxs_gpu_available() -> c_int;

    pub fn mlxs_array_free(a: *mut mlxs_array);
    pub fn mlxs_array_clone(out: Out, a: Arr) -> c_int;
    pub fn mlxs_array_ndim(a: Arr) -> usize;
    pub fn mlxs_array_shape(a: Arr) -> *const i32;
    pub fn mlxs_array_dtype(a: Arr) -> c_int;
    pub fn mlxs_array_size(a: Arr) -> usize;
    pub fn mlxs_array_nbytes(a: Arr) -> usize;

    pub fn mlxs_array_from_bytes(
        out: Out,
        data: *const c_void,
        shape: *const i32,
        ndim: usize,
        dtype: c_int,
    ) -> c_int;
    pub fn mlxs_array_wrap(
        out: Out,
        data: *mut c_void,
        shape: *const i32,
        ndim: usize,
        dtype: c_int,
        mapped: c_int,
        deleter: unsafe extern "C" fn(*mut c_void),
        ctx: *mut c_void,
    ) -> c_int;
    pub fn mlxs_full(out: Out, shape: *const i32, ndim: usize, value: f64, dtype: c_int) -> c_int;
    pub fn mlxs_arange(out: Out, start: f64, stop: f64, step: f64, dtype: c_int) -> c_int;

    pub fn mlxs_eval(xs: *const *mut mlxs_array, n: usize) -> c_int;
    pub fn mlxs_to_bytes(a: Arr, dst: *mut c_void, dst_len: usize) -> c_int;

    pub fn mlxs_where(out: Out, cond: Arr, a: Arr, b: Arr) -> c_int;
    pub fn mlxs_clip(out: Out, a: Arr, lo: Arr, hi: Arr) -> c_int;
    pub fn mlxs_addmm(out: Out, c: Arr, a: Arr, b: Arr, alpha: f32, beta: f32) -> c_int;
    pub fn mlxs_astype(out: Out, a: Arr, dtype: c_int) -> c_int;
    pub fn mlxs_view(out: Out, a: Arr, dtype: c_int) -> c_int;

    pub fn mlxs_reshape(out: Out, a: Arr, shape: *const i32, ndim: usize) -> c_int;
    pub fn mlxs_transpose(out: Out, a: Arr, axes: *const i32, n: usize) -> c_int;
    pub fn mlxs_swapaxes(out: Out, a: Arr, a1: c_int, a2: c_int) -> c_int;
    pub fn mlxs_expand_dims(out: Out, a: Arr, axis: c_int) -> c_int;
    pub fn mlxs_squeeze(out: Out, a: Arr, axis: c_int) -> c_int;
    pub fn mlxs_broadcast_to(out: Out, a: Arr, shape: *const i32, ndim: usize) -> c_int;
    pub fn mlxs_repeat(out: Out, a: Arr, repeats: c_int, axis: c_int) -> c_int;
    pub fn mlxs_slice(
        out: Out,
        a: Arr,
        start: *const i32,
        stop: *const i32,
        strides: *const i32,
        ndim: usize,
    ) -> c_int;
    pub fn mlxs_take(out: Out, a: Arr, indices: Arr, axis: c_int) -> c_int;
    pub fn mlxs_take_along_axis(out: Out, a: Arr, indices: Arr, axis: c_int) -> c_int;
    pub fn mlxs_concatenate(out: Out, xs: *const Arr, n: usize, axis: c_int) -> c_int;
    pub fn mlxs_stack(out: Out, xs: *const Arr, n: usize, axis: c_int) -> c_int;
    pub fn mlxs_split(
        outs: *mut *mut mlxs_array,
        max_outs: usize,
        count: *mut usize,
        a: Arr,
        parts: c_int,
        indices: *const i32,
        n_indices: usize,
        axis: c_int,
    ) -> c_int;
    pub fn mlxs_pad(
        out: Out,
        a: Arr,
        low: *const i32,
        high: *const i32,
        ndim: usize,
        value: f32,
    ) -> c_int;

    pub fn mlxs_var(
        out: Out,
        a: Arr,
        axes: *const i32,
        n: usize,
        keepdims: c_int,
        ddof: c_int,
    ) -> c_int;
    pub fn mlxs_softmax(out: Out, a: Arr, axes: *const i32, n: usize, precise: c_int) -> c_int;

    pub fn mlxs_conv2d(
        out: Out,
        x: Arr,
        w: Arr,
        sh: c_int,
        sw: c_int,
        ph: c_int,
        pw: c_int,
        dh: c_int,
        dw: c_int,
        groups: c_int,
    ) -> c_int;

    pub fn mlxs_quantized_matmul(
        out: Out,
        x: Arr,
        wq: Arr,
        scales: Arr,
        biases: Arr,
        transpose: c_int,
        group_size: c_int,
        bits: c_int,
    ) -> c_int;

    pub fn mlxs_fast_linear(
        out: Out,
        x: Arr,
        w: Arr,
        scales: Arr,
        biases: Arr,
        bias: Arr,
        group_size: c_int,
        bits: c_int,
        mode: *const c_char,
        bf16_products: c_int,
    ) -> c_int;
    pub fn mlxs_bf16_products_available() -> c_int;
    pub fn mlxs_quantize_mode(
        wq: Out,
        scales: Out,
        biases: Out,
        w: Arr,
        group_size: c_int,
        bits: c_int,
        mode: *const c_char,
    ) -> c_int;
    pub fn mlxs_dequantize_mode(
        out: Out,
        wq: Arr,
        scales: Arr,
        biases: Arr,
        group_size: c_int,
        bits: c_int,
        mode: *const c_char,
    ) -> c_int;
    pub fn mlxs_fast_rms_norm(out: Out, x: Arr, weight: Arr, eps: f32) -> c_int;
    pub fn mlxs_fast_rms_norm_residual(
        out: Out,
        x: Arr,
        weight: Arr,
        eps: f32,
        residual: Arr,
    ) -> c_int;
    pub fn mlxs_fast_qkv(
        out: Out,
        qkv: Arr,
        q_weight: Arr,
        k_weight: Arr,
        cos: Arr,
        sin: Arr,
        heads: c_int,
        eps: f32,
        q_scale: f32,
        attend: c_int,
    ) -> c_int;
    pub fn mlxs_fast_attention_rows(out: Out, qkv: Arr) -> c_int;
    pub fn mlxs_fast_silu_gate(out: Out, x: Arr) -> c_int;
    pub fn mlxs_fast_group_norm(
        out: Out,
        x: Arr,
        weight: Arr,
        bias: Arr,
        groups: c_int,
        eps: f32,
        silu: c_int,
    ) -> c_int;
    pub fn mlxs_fast_conv2d(
        out: Out,
        x: Arr,
        weight: Arr,
        bias: Arr,
        k: c_int,
        stride: c_int,
        pad_lo: c_int,
        pad_hi: c_int,
    ) -> c_int;
    pub fn mlxs_fast_conv3x3_same(
        out: Out,
        x: Arr,
        weight: Arr,
        bias: Arr,
        upsample: c_int,
        residual: Arr,
    ) -> c_int;
    pub fn mlxs_fast_layer_norm(out: Out, x: Arr, weight: Arr, bias: Arr, eps: f32) -> c_int;
    pub fn mlxs_fast_rope(
        out: Out,
        x: Arr,
        dims: c_int,
        traditional: c_int,
        has_base: c_int,
        base: f32,
        scale: f32,
        offset: c_int,
        freqs: Arr,
    ) -> c_int;
    pub fn mlxs_fast_scaled_dot_product_attention(
        out: Out,
        q: Arr,
        k: Arr,
        v: Arr,
        scale: f32,
        mask_mode: *const c_char,
        mask: Arr,
    ) -> c_int;

    pub fn mlxs_random_key(out: Out, seed: u64) -> c_int;
    pub fn mlxs_random_normal(
        out: Out,
        shape: *const i32,
        ndim: usize,
        dtype: c_int,
        key: Arr,
    ) -> c_int;

    pub fn mlxs_load_safetensors(
        path: *const c_char,
        names: *mut *mut *mut c_char,
        arrays: *mut *mut *mut mlxs_array,
        n_arrays: *mut usize,
        meta_keys: *mut *mut *mut c_char,
        meta_values: *mut *mut *mut c_char,
        n_meta: *mut usize,
    ) -> c_int;
    pub fn mlxs_save_safetensors(
        path: *const c_char,
        names: *const *const c_char,
        arrays: *const Arr,
        n: usize,
        meta_keys: *const *const c_char,
        meta_values: *const *const c_char,
        n_meta: usize,
    ) -> c_int;
    pub fn mlxs_free_strings(strings: *mut *mut c_char, n: usize);
    pub fn mlxs_free_array_list(arrays: *mut *mut mlxs_array);

    pub fn mlxs_get_active_memory() -> usize;
    pub fn mlxs_get_peak_memory() -> usize;
    pub fn mlxs_get_cache_memory() -> usize;
    pub fn mlxs_reset_peak_memory();
    pub fn mlxs_clear_cache();
    pub fn mlxs_get_memory_limit() -> usize;
    pub fn mlxs_set_cache_limit(limit: usize) -> usize;
    pub fn mlxs_set_wired_limit(limit: usize) -> usize;
    pub fn mlxs_device_memory() -> usize;

    pub fn mlxs_blas_description() -> *const c_char;
    pub fn mlxs_blas_sgemm(
        m: c_int,
        n: c_int,
        k: c_int,
        a: *const f32,
        b: *const f32,
        c: *mut f32,
    ) -> c_int;
    /// The process-wide `cblas_sgemm`, or null. The shim's own CPU kernels call it; Rust does
    /// not, but this file mirrors shim.h whole so that the two can be checked against each other.
    #[allow(dead_code)]
    pub fn mlxs_sgemm_symbol() -> *mut c_void;
}
