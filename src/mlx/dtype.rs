//! Element types, with the codes the shim uses and the safetensors spellings.

use half::{bf16, f16};

/// MLX's element types (`mlx::core::Dtype::Val`, in that order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Dtype {
    Bool = 0,
    U8,
    U16,
    U32,
    U64,
    I8,
    I16,
    I32,
    I64,
    F16,
    F32,
    F64,
    BF16,
    C64,
}

impl Dtype {
    pub(crate) fn code(self) -> i32 {
        self as i32
    }

    pub(crate) fn from_code(code: i32) -> Dtype {
        use Dtype::*;
        [
            Bool, U8, U16, U32, U64, I8, I16, I32, I64, F16, F32, F64, BF16, C64,
        ]
        .get(code as usize)
        .copied()
        .unwrap_or_else(|| panic!("MLX returned unknown dtype code {code}"))
    }

    pub fn size_bytes(self) -> usize {
        use Dtype::*;
        match self {
            Bool | U8 | I8 => 1,
            U16 | I16 | F16 | BF16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | C64 => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::F32 | Dtype::F64 | Dtype::BF16)
    }

    /// The safetensors header spelling (`"BF16"`).
    pub fn safetensors_name(self) -> &'static str {
        use Dtype::*;
        match self {
            Bool => "BOOL",
            U8 => "U8",
            U16 => "U16",
            U32 => "U32",
            U64 => "U64",
            I8 => "I8",
            I16 => "I16",
            I32 => "I32",
            I64 => "I64",
            F16 => "F16",
            F32 => "F32",
            F64 => "F64",
            BF16 => "BF16",
            C64 => "C64",
        }
    }

    /// The MLX type for a safetensors dtype spelling, if MLX has one.
    pub fn from_safetensors(name: &str) -> Option<Dtype> {
        use Dtype::*;
        [
            Bool, U8, U16, U32, U64, I8, I16, I32, I64, F16, F32, F64, BF16, C64,
        ]
        .into_iter()
        .find(|d| d.safetensors_name() == name)
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.safetensors_name().to_lowercase())
    }
}

/// Rust element types that map one-to-one onto an MLX dtype.
pub trait ArrayElement: Copy + Default + 'static {
    const DTYPE: Dtype;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => { $(impl ArrayElement for $t { const DTYPE: Dtype = Dtype::$d; })* };
}
element!(bool => Bool, u8 => U8, u16 => U16, u32 => U32, u64 => U64, i8 => I8, i16 => I16, i32 => I32,
         i64 => I64, f16 => F16, f32 => F32, f64 => F64, bf16 => BF16);
