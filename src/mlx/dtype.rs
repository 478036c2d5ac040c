//! The element types MLX holds, with the codes the shim uses.

use half::{bf16, f16};

pub use crate::dtype::Dtype;

/// MLX's element types in the order of `mlx::core::Dtype::Val`: the codes the shim speaks.
const MLX_ORDER: [Dtype; 14] = [
    Dtype::BOOL,
    Dtype::U8,
    Dtype::U16,
    Dtype::U32,
    Dtype::U64,
    Dtype::I8,
    Dtype::I16,
    Dtype::I32,
    Dtype::I64,
    Dtype::F16,
    Dtype::F32,
    Dtype::F64,
    Dtype::BF16,
    Dtype::C64,
];

impl Dtype {
    /// MLX has an array type for it.
    pub fn in_mlx(self) -> bool {
        MLX_ORDER.contains(&self)
    }

    /// The shim's code for this type, or an error naming `op` for types MLX lacks.
    #[track_caller]
    pub(crate) fn code(self, op: &'static str) -> super::Result<i32> {
        match MLX_ORDER.iter().position(|&d| d == self) {
            Some(code) => Ok(code as i32),
            None => Err(super::Error::new(
                op,
                format!("MLX has no {} arrays", self.name()),
            )),
        }
    }

    pub(crate) fn from_code(code: i32) -> Dtype {
        usize::try_from(code)
            .ok()
            .and_then(|i| MLX_ORDER.get(i))
            .copied()
            .unwrap_or_else(|| panic!("MLX returned unknown dtype code {code}"))
    }
}

/// Rust element types that map one-to-one onto an MLX dtype.
pub trait ArrayElement: Copy + Default + 'static {
    /// The MLX dtype of this element type.
    const DTYPE: Dtype;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => { $(impl ArrayElement for $t { const DTYPE: Dtype = Dtype::$d; })* };
}
element!(bool => BOOL, u8 => U8, u16 => U16, u32 => U32, u64 => U64, i8 => I8, i16 => I16, i32 => I32,
         i64 => I64, f16 => F16, f32 => F32, f64 => F64, bf16 => BF16);
