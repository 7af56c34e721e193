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
element!(f16, DType::F16, |x| x.to_f64(), |v| f16_from_f64(v));
element!(bf16, DType::BF16, |x| x.to_f64(), |v| bf16_from_f64(v));
element!(i32, DType::I32, |x| x as f64, |v| v as i32);
element!(i64, DType::I64, |x| x as f64, |v| v as i64);
element!(u8, DType::U8, |x| x as f64, |v| v as u8);

/// `v` as f32 rounded toward zero, its last bit set when inexact ("round to odd"): with at
/// least two bits more than f16 and bf16 keep, it rounds to either exactly as `v` itself
/// would, so one correct rounding from f64 takes two steps through it.
fn f32_round_to_odd(v: f64) -> f32 {
    let f = v as f32;
    if f.is_nan() || f.is_infinite() || f as f64 == v {
        return f;
    }
    let mut bits = f.to_bits();
    // Rounded away from zero: one unit back (the sign is its own bit).
    if (f as f64).abs() > v.abs() {
        bits -= 1;
    }
    f32::from_bits(bits | 1)
}

/// f64 to f16, rounded once to nearest-even. `half`'s own `from_f64` rounds twice (through
/// f32, where the CPU has F16C) or drops the low 32 mantissa bits first (elsewhere), so its
/// result depended on the machine, and differed from CUDA's and from the WGSL kernels'.
pub fn f16_from_f64(v: f64) -> f16 {
    f16::from_f32(f32_round_to_odd(v))
}

/// f64 to bf16, rounded once to nearest-even (see [`f16_from_f64`]).
pub fn bf16_from_f64(v: f64) -> bf16 {
    bf16::from_f32(f32_round_to_odd(v))
}

/// Encodes `v` as one element of `dtype` (little-endian bytes), rounding as [`Element::from_f64`].
pub fn encode(dtype: DType, v: f64, out: &mut Vec<u8>) {
    match dtype {
        DType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
        DType::F16 => out.extend_from_slice(&f16_from_f64(v).to_le_bytes()),
        DType::BF16 => out.extend_from_slice(&bf16_from_f64(v).to_le_bytes()),
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

    /// `x` (a positive integer) rounded to nearest-even at `keep` significant bits: the exact
    /// reference, in integers.
    fn round_int(x: u64, keep: u32) -> u64 {
        let d = (64 - x.leading_zeros()).saturating_sub(keep);
        if d == 0 {
            return x;
        }
        let (q, rem, half) = (x >> d, x & ((1 << d) - 1), 1u64 << (d - 1));
        let up = rem > half || (rem == half && q & 1 == 1);
        (q + u64::from(up)) << d
    }

    /// f64 to f16 and bf16 rounds once: against integer rounding for integers of up to 53
    /// bits (f64-exact), including ties and near-ties in every bit position, where rounding
    /// through f32 (or dropping low mantissa bits first) goes wrong.
    #[test]
    fn f64_to_half_types_rounds_once() {
        let mut r = super::super::SplitMix64::new(11);
        let mut values: Vec<u64> = (0..20_000)
            .map(|_| r.next_u64() >> (11 + r.below(40)))
            .collect();
        for k in 12..53 {
            for d in [-1i64, 0, 1] {
                for tail in [0u32, 1, 8, 16] {
                    let base = (1u64 << k) | (1u64 << (k - 9)) | (1u64 << (k - 12));
                    values.push(((base >> tail) << tail).wrapping_add_signed(d));
                }
            }
        }
        for x in values.into_iter().filter(|&x| x > 0 && x <= 1 << 53) {
            let v = x as f64;
            assert_eq!(
                bf16_from_f64(v).to_f64(),
                round_int(x, 8) as f64,
                "bf16 of {x}"
            );
            let f16_want = round_int(x, 11) as f64;
            let f16_want = if f16_want > 65504.0 {
                f64::INFINITY
            } else {
                f16_want
            };
            assert_eq!(f16_from_f64(v).to_f64(), f16_want, "f16 of {x}");
            assert_eq!(bf16_from_f64(-v).to_f64(), -(round_int(x, 8) as f64));
        }
        assert!(bf16_from_f64(f64::NAN).is_nan() && f16_from_f64(f64::NAN).is_nan());
        assert_eq!(bf16_from_f64(1e300), bf16::INFINITY);
        assert_eq!(f16_from_f64(-1e300), f16::NEG_INFINITY);
        assert_eq!(
            f16_from_f64(1e-30).to_bits(),
            0,
            "below f16's subnormals: zero"
        );
        assert_eq!(f16_from_f64(65519.99).to_f64(), 65504.0);
        assert_eq!(f16_from_f64(65520.0), f16::INFINITY);
    }
}
