//! Plans the reduce kernels (`reduce.cu`): the kept dimensions are the outer space (one block
//! per output element), the reduced ones the inner space.

use std::sync::Arc;

use super::args::{blocks, Space, BLOCK};
use super::prepared::{prepare as ready, Operand, Step};
use super::{unexpected, Family, FLOATS};
use crate::error::Result;
use crate::ops::{Params, PlanSpec, PreparedKernel};

pub(super) const FAMILY: Family = Family {
    name: "reduce",
    text: include_str!("reduce.cu"),
    ops: &["sum", "mean", "max", "min", "argmax"],
    dtypes: FLOATS,
    entries: &["op_sum", "op_mean", "op_max", "op_min", "op_argmax"],
    prepare,
    params: (2, 44),
    source_dtype: super::own_source,
};

fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    let (Params::Reduce { axes, keepdim }, [x], [out]) = (spec.params, spec.inputs, spec.outputs)
    else {
        return Err(unexpected(spec, FAMILY.name));
    };
    let (xs, xt) = (x.layout.shape(), x.layout.strides());
    let ot = out.layout.strides();
    let (mut kept, mut kept_in, mut kept_out, mut red, mut red_in) =
        (vec![], vec![], vec![], vec![], vec![]);
    let mut o = 0;
    for d in 0..xs.len() {
        if axes.contains(&d) {
            red.push(xs[d]);
            red_in.push(xt[d] as i64);
            if *keepdim {
                o += 1;
            }
        } else {
            kept.push(xs[d]);
            kept_in.push(xt[d] as i64);
            kept_out.push(ot.get(o).copied().unwrap_or(0) as i64);
            o += 1;
        }
    }
    let outer = Space::new(spec.op, &kept, &[kept_out, kept_in])?;
    let inner = Space::new(spec.op, &red, &[red_in])?;
    let mut step = Step::new(
        format!("op_{}", spec.op),
        [blocks(outer.count(), 1), 1, 1],
        [BLOCK, 1, 1],
    );
    step.ptrs = vec![Operand::Out(0, 0), Operand::In(0)];
    step.args
        .space(&outer)
        .space(&inner)
        .strides(&outer, 0)
        .strides(&outer, 1)
        .strides(&inner, 0);
    ready(spec, &FAMILY, spec.dtype, vec![step])
}
