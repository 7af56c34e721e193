//! Element types: [`DType`] (the runtime tag) and [`Element`] (the Rust types behind it).

use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};

use crate::error::Error;

/// The element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    I32,
    I64,
    U8,
    /// One byte per element, 0 or 1.
    Bool,
}

impl DType {
    /// Every dtype, in a stable order.
    pub const ALL: [DType; 7] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::Bool,
    ];
    /// The floating-point dtypes every operator supports.
    pub const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
            DType::U8 | DType::Bool => 1,
        }
    }

    /// The lower-case name used in case names, tables and JSON (`f32`, `bf16`, …).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }

    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    pub const fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64 | DType::U8)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        DType::ALL
            .into_iter()
            .find(|d| d.name() == s.trim().to_ascii_lowercase())
            .ok_or_else(|| Error::BadParam(format!("unknown dtype {s:?}")))
    }
}

/// A Rust type that can be a tensor element. Conversions go through `f64`, which represents
/// every value of every element type exactly except the largest `i64`s.
pub trait Element: Copy + Send + Sync + bytemuck::Pod + PartialEq + fmt::Debug + 'static {
    const DTYPE: DType;
    fn to_f64(self) -> f64;
    /// Rounds to nearest (floats) or truncates and saturates (integers).
    fn from_f64(v: f64) -> Self;
}

macro_rules! element {
    ($t:ty, $d:expr, |$x:ident| $to:expr, |$v:ident| $from:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            fn to_f64(self) -> f64 {
                let $x = self;
                $to
            }
            fn from_f64($v: f64) -> Self {
                $from
            }
        }
    };
}

element!(f32, DType::F32, |x| x as f64, |v| v as f32);
element!(f16, DType::F16, |x| x.to_f64(), |v| f16::from_f64(v));
element!(bf16, DType::BF16, |x| x.to_f64(), |v| bf16::from_f64(v));
element!(i32, DType::I32, |x| x as f64, |v| v as i32);
element!(i64, DType::I64, |x| x as f64, |v| v as i64);
element!(u8, DType::U8, |x| x as f64, |v| v as u8);

/// Encodes `v` as one element of `dtype` (little-endian bytes), rounding as [`Element::from_f64`].
pub fn encode(dtype: DType, v: f64, out: &mut Vec<u8>) {
    match dtype {
        DType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
        DType::F16 => out.extend_from_slice(&f16::from_f64(v).to_le_bytes()),
        DType::BF16 => out.extend_from_slice(&bf16::from_f64(v).to_le_bytes()),
        DType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
        DType::I64 => out.extend_from_slice(&(v as i64).to_le_bytes()),
        DType::U8 => out.push(v as u8),
        DType::Bool => out.push(u8::from(v != 0.0)),
    }
}

/// Decodes the element of `dtype` that starts at `bytes[0]` (which holds at least
/// `dtype.size()` bytes).
pub fn decode(dtype: DType, bytes: &[u8]) -> f64 {
    let mut b8 = [0u8; 8];
    let n = dtype.size().min(bytes.len());
    b8[..n].copy_from_slice(&bytes[..n]);
    match dtype {
        DType::F32 => f32::from_le_bytes([b8[0], b8[1], b8[2], b8[3]]) as f64,
        DType::F16 => f16::from_le_bytes([b8[0], b8[1]]).to_f64(),
        DType::BF16 => bf16::from_le_bytes([b8[0], b8[1]]).to_f64(),
        DType::I32 => i32::from_le_bytes([b8[0], b8[1], b8[2], b8[3]]) as f64,
        DType::I64 => i64::from_le_bytes(b8) as f64,
        DType::U8 | DType::Bool => b8[0] as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_names() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
            let mut v = Vec::new();
            encode(d, 1.0, &mut v);
            assert_eq!(v.len(), d.size());
            assert_eq!(decode(d, &v), 1.0);
        }
        assert_eq!(bf16::from_f64(3.0).to_f64(), 3.0);
        assert_eq!(<i64 as Element>::from_f64(-7.9), -7);
    }
}
