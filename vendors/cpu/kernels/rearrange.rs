//! `rearrange` (strided copy of any layout into any layout) and `concat`. Both move elements
//! as plain words of the dtype's size, so one kernel serves every dtype.

use super::util::{coalesce, par_rows, Ptr};
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::ops::{KernelCall, KernelImpl, KernelRegistry, Params, TensorRef};
use crate::tensor::{DType, Layout};

/// Copies `src` (viewed with `src_layout`) into `dst` (viewed with `dst_layout`), same shape.
fn copy_words<W: Copy + Send + Sync + 'static>(
    dst: &TensorRef,
    dst_layout: &Layout,
    src: &TensorRef,
) {
    let (shape, strides) = coalesce(
        dst_layout.shape(),
        [dst_layout.strides(), src.layout.strides()],
    );
    let size = std::mem::size_of::<W>();
    let pd = Ptr::<W>((dst.base as usize + dst_layout.offset() * size) as *mut W);
    let ps = Ptr::<W>::of(src);
    par_rows(&shape, &strides, |off, len, st| {
        // SAFETY: the rows lie in the checked views; the plan refuses overlapping source and
        // destination, so the non-overlapping copy is sound.
        unsafe {
            if st == [1, 1] {
                std::ptr::copy_nonoverlapping(ps.at(off[1]), pd.at(off[0]), len);
            } else {
                for i in 0..len {
                    *pd.at(off[0] + i * st[0]) = *ps.at(off[1] + i * st[1]);
                }
            }
        }
    });
}

fn copy_any(dst: &TensorRef, dst_layout: &Layout, src: &TensorRef) {
    match src.dtype.size() {
        1 => copy_words::<u8>(dst, dst_layout, src),
        2 => copy_words::<u16>(dst, dst_layout, src),
        4 => copy_words::<u32>(dst, dst_layout, src),
        _ => copy_words::<u64>(dst, dst_layout, src),
    }
}

fn rearrange(call: &KernelCall<'_>) -> Result<()> {
    let out = &call.outputs[0];
    copy_any(out, &out.layout, &call.inputs[0]);
    Ok(())
}

fn concat(call: &KernelCall<'_>) -> Result<()> {
    let Params::Concat { axis } = *call.params else {
        return Err(Error::Internal(format!(
            "concat: parameters {:?}",
            call.params
        )));
    };
    let out = &call.outputs[0];
    let mut start = 0;
    for src in call.inputs {
        let len = src.layout.shape()[axis];
        let view = out.layout.narrow(axis as isize, start, len)?;
        copy_any(out, &view, src);
        start += len;
    }
    Ok(())
}

pub(super) fn register(reg: &mut KernelRegistry) {
    for d in DType::ALL {
        reg.builtin("rearrange", DeviceKind::Cpu, d, KernelImpl::Host(rearrange));
        reg.builtin("concat", DeviceKind::Cpu, d, KernelImpl::Host(concat));
    }
}
