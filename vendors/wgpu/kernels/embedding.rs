//! `embedding` in WGSL: one work item per output element gathers `table[id, j]` (ids read in
//! place, i32 or i64). An id outside the table cannot be reported from the device yet (the
//! kernel clamps it into the table so no access leaves it); the conformance case that checks
//! the error is declared unsupported on wgpu with that reason.
//!
//! Constants: `cfg[0]` the output elements, `cfg[1]` the row length, `cfg[2]` vocab,
//! `cfg[3]` / `cfg[4]` the table's strides, `cfg[5]` where the ids' view starts.

use std::sync::Arc;

use super::elementwise::groups_for;
use super::op::{prepare as prepare_op, OpSource};
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
    let source = format!(
        "{}\n{MAIN_1D} {{\n    let i = {LINEAR_ID};\n    if (i >= cfg[0]) {{ return; }}\n    \
         let r = i / cfg[1];\n    let j = i % cfg[1];\n    \
         let id = u32(clamp(ldi_ids(view_off(r, cfg[5])), 0, i32(cfg[2]) - 1));\n    \
         st_out(i, ld_table(id * cfg[3] + j * cfg[4]));\n}}\n",
        wgsl::prelude(&binds)
    );
    prepare_op(
        spec,
        OpSource {
            name: "embedding".into(),
            passes: vec![(source, groups_for(n as u64))],
            cfg,
            entry: None,
            zero_workgroup_memory: false,
            aligned: None,
        },
    )
}

pub(super) fn register(reg: &mut crate::ops::KernelRegistry) {
    reg_all(reg, "embedding", FLOATS, prepare);
}
