//! `cast`: every source dtype to every dtype, through `f64` (exact for every source value
//! except `i64` beyond 2^53), rounding once into the destination.

use half::{bf16, f16};

use super::util::{coalesce, par_rows, Ptr};
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::ops::{KernelCall, KernelImpl, KernelRegistry, Params};
use crate::tensor::{DType, Element};

/// A destination element made from `f64` (bool: `x != 0`).
trait Dst: Copy + Send + Sync + 'static {
    fn make(v: f64) -> Self;
}

macro_rules! dst_element {
    ($($t:ty),*) => {$(
        impl Dst for $t {
            #[inline(always)]
            fn make(v: f64) -> Self { <$t as Element>::from_f64(v) }
        }
    )*};
}
dst_element!(f32, f16, bf16, i32, i64, u8);

/// Bool stored as one byte.
#[derive(Clone, Copy)]
#[repr(transparent)]
struct BoolByte(#[allow(dead_code)] u8); // written through raw pointers only
impl Dst for BoolByte {
    fn make(v: f64) -> Self {
        BoolByte(u8::from(v != 0.0))
    }
}

fn cast_to<S: Element, D: Dst>(call: &KernelCall<'_>) {
    let (src, out) = (&call.inputs[0], &call.outputs[0]);
    let (shape, strides) = coalesce(
        out.layout.shape(),
        [out.layout.strides(), src.layout.strides()],
    );
    let (po, ps) = (Ptr::<D>::of(out), Ptr::<S>::of(src));
    par_rows(&shape, &strides, |off, len, st| {
        for i in 0..len {
            // SAFETY: element i of both rows lies in the checked views; output and input do
            // not overlap (cast does not work in place).
            unsafe { *po.at(off[0] + i * st[0]) = D::make((*ps.at(off[1] + i * st[1])).to_f64()) };
        }
    });
}

fn cast<S: Element>(call: &KernelCall<'_>) -> Result<()> {
    let Params::Cast { to } = call.params else {
        return Err(Error::Internal(format!(
            "cast: parameters {:?}",
            call.params
        )));
    };
    match to {
        DType::F32 => cast_to::<S, f32>(call),
        DType::F16 => cast_to::<S, f16>(call),
        DType::BF16 => cast_to::<S, bf16>(call),
        DType::I32 => cast_to::<S, i32>(call),
        DType::I64 => cast_to::<S, i64>(call),
        DType::U8 => cast_to::<S, u8>(call),
        DType::Bool => cast_to::<S, BoolByte>(call),
    }
    Ok(())
}

pub(super) fn register(reg: &mut KernelRegistry) {
    let cpu = DeviceKind::Cpu;
    reg.builtin("cast", cpu, DType::F32, KernelImpl::Host(cast::<f32>));
    reg.builtin("cast", cpu, DType::F16, KernelImpl::Host(cast::<f16>));
    reg.builtin("cast", cpu, DType::BF16, KernelImpl::Host(cast::<bf16>));
    reg.builtin("cast", cpu, DType::I32, KernelImpl::Host(cast::<i32>));
    reg.builtin("cast", cpu, DType::I64, KernelImpl::Host(cast::<i64>));
    reg.builtin("cast", cpu, DType::U8, KernelImpl::Host(cast::<u8>));
    // Bool is stored as bytes 0/1, so u8's kernel reads it.
    reg.builtin("cast", cpu, DType::Bool, KernelImpl::Host(cast::<u8>));
}
