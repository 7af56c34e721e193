//! embedding: every id is checked against the vocabulary first (an error writes nothing),
//! then rows are copied in parallel.

use super::util::{
    floats, gather, read_index, scatter, try_par_chunks, Float, Lanes, Ptr, Scratch,
};
use crate::error::{Error, Result};
use crate::ops::KernelCall;
use crate::ops::KernelRegistry;

fn embedding<T: Float>(call: &KernelCall<'_>) -> Result<()> {
    let (ids, table, out) = (&call.inputs[0], &call.inputs[1], &call.outputs[0]);
    let (vocab, dim) = (table.layout.shape()[0], table.layout.shape()[1]);
    let (ts0, ts1) = (table.layout.strides()[0], table.layout.strides()[1]);
    // The ids as a flat list, read through their (any) layout.
    let id_lanes = Lanes::new([&ids.layout.unsqueeze(-1)?], ids.layout.ndim());
    let n = id_lanes.count();
    let mut rows = Vec::with_capacity(n);
    for i in 0..n {
        let [off] = id_lanes.offsets(i);
        // SAFETY: element i of the checked id view.
        let id = unsafe { read_index(ids, off) };
        if id < 0 || id as u64 >= vocab as u64 {
            return Err(Error::IndexOutOfRange {
                op: "embedding".into(),
                index: id,
                limit: vocab as u64,
            });
        }
        rows.push(id as usize);
    }
    let (pt, po) = (Ptr::<T>::of(table), Ptr::<T>::of(out));
    let out_lanes = Lanes::new([&out.layout], out.layout.ndim() - 1);
    try_par_chunks(n, dim, |range| {
        let mut buf = Scratch::zeroed(dim)?;
        for i in range {
            let [oo] = out_lanes.offsets(i);
            // SAFETY: row rows[i] < vocab of the checked table; row i of the output.
            unsafe {
                gather(pt.at(rows[i] * ts0), ts1, &mut buf);
                scatter(&buf, po.at(oo), out_lanes.stride[0]);
            }
        }
        Ok(())
    })?;
    Ok(())
}

pub(super) fn register(reg: &mut KernelRegistry) {
    floats!(reg, "embedding", embedding);
}
