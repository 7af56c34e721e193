//! `embedding` in WGSL: one work item per output element gathers `table[id, j]` (ids read in
//! place, i32 or i64). An id outside the table is never read through: the work item writes a
//! zero and claims the plan's fault word with the id, which the stream's next synchronisation
//! reports as [`crate::Error::IndexOutOfRange`] (see `vendors/wgpu/fault.rs`).
//!
//! Constants: `cfg[0]` the output elements, `cfg[1]` the row length, `cfg[2]` vocab,
//! `cfg[3]` / `cfg[4]` the table's strides, `cfg[5]` where the ids' view starts.

use std::sync::Arc;

use super::elementwise::groups_for;
use super::op::{prepare_checked, FaultSpec, OpSource};
use super::wgsl::{self, Bind, LINEAR_ID, MAIN_1D};
use super::{reg_all, FLOATS};
use crate::error::Result;
use crate::ops::{PlanSpec, PreparedKernel};

fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    let (ids, table, out) = (&spec.inputs[0], &spec.inputs[1], &spec.outputs[0]);
    let (vocab, dim) = (table.layout.shape()[0], table.layout.shape()[1]);
    let n = out.layout.numel();
    let ts = table.layout.strides();
    let mut cfg = vec![
        n as u32,
        dim as u32,
        vocab as u32,
        ts[0] as u32,
        ts[1] as u32,
        0,
    ];
    cfg[5] = wgsl::push_view(&mut cfg, ids.layout.shape(), ids.layout.strides());
    let binds = [
        Bind::read("ids", ids.dtype),
        Bind::read("table", table.dtype),
        Bind::write("out", out.dtype),
    ];
    // A valid id has a zero high word (i64) and a low word below the vocabulary: a negative
    // i32 id reads as a large u32.
    let source = format!(
        "{}\n{}\n{MAIN_1D} {{\n    let i = {LINEAR_ID};\n    if (i >= cfg[0]) {{ return; }}\n    \
         let r = i / cfg[1];\n    let j = i % cfg[1];\n    \
         let w = ldr_ids(view_off(r, cfg[5]));\n    \
         if (w.y != 0u || w.x >= cfg[2]) {{ fault_claim(w.x, w.y); st_out(i, 0.0); return; }}\n    \
         st_out(i, ld_table(w.x * cfg[3] + j * cfg[4]));\n}}\n",
        wgsl::prelude(&binds, wgsl::Dialect::of(spec)),
        super::super::fault::wgsl(binds.len() + 1),
    );
    prepare_checked(
        spec,
        OpSource::plain("embedding", vec![(source, groups_for(n as u64))], cfg),
        FaultSpec {
            limit: vocab as u64,
            wide: ids.dtype == crate::tensor::DType::I64,
        },
    )
}

pub(super) fn register(reg: &mut crate::ops::KernelRegistry) {
    reg_all(reg, "embedding", FLOATS, prepare);
}
