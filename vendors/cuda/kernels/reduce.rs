//! Plans the reduce kernels (`reduce.cu`): the kept dimensions are the outer space, the
//! reduced ones the inner space. Many outputs: one block per output element. A few outputs
//! over many elements: a split pass into the plan's workspace (chunk × output blocks), then a
//! combine pass (one block per output); [`split_count`] decides, for the workspace size too.

use std::sync::Arc;

use super::args::{blocks, Space, BLOCK};
use super::prepared::{prepare as ready, Operand, Step};
use super::{unexpected, Family, FLOATS};
use crate::error::{Error, Result};
use crate::ops::reduce::{split_count, split_workspace};
use crate::ops::{Params, PlanSpec, PreparedKernel};

pub(super) const FAMILY: Family = Family {
    name: "reduce",
    text: include_str!("reduce.cu"),
    ops: &["sum", "mean", "max", "min", "argmax"],
    dtypes: FLOATS,
    entries: &[
        "op_sum",
        "op_mean",
        "op_max",
        "op_min",
        "op_argmax",
        "op_sum_split",
        "op_max_split",
        "op_min_split",
        "op_argmax_split",
        "op_sum_combine",
        "op_mean_combine",
        "op_max_combine",
        "op_min_combine",
        "op_argmax_combine",
    ],
    prepare,
    params: (2, 46),
    source_dtype: super::own_source,
};

fn prepare(spec: &PlanSpec<'_>) -> Result<Arc<dyn PreparedKernel>> {
    ready(spec, &FAMILY, spec.dtype, steps(spec)?)
}

/// The plan's launches (no device needed: the unit tests check them).
fn steps(spec: &PlanSpec<'_>) -> Result<Vec<Step>> {
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
        // Sorted (`Params::Reduce`): a search, not a scan per dimension (quadratic in rank).
        if axes.binary_search(&d).is_ok() {
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
    let (outputs, reduced) = (outer.count(), inner.count());
    let splits = split_count(outputs as usize, reduced as usize);
    // Each chunk but the last is full, so no block reduces an empty range.
    let chunk = (reduced.max(1) + splits as i64 - 1) / splits as i64;
    let splits = (reduced.max(1) + chunk - 1) / chunk;
    let mut args = super::args::Args::new();
    args.space(&outer)
        .space(&inner)
        .strides(&outer, 0)
        .strides(&outer, 1)
        .strides(&inner, 0)
        .int(splits)
        .int(chunk);
    if splits <= 1 {
        let mut step = Step::new(
            format!("op_{}", spec.op),
            [blocks(outputs, 1), 1, 1],
            [BLOCK, 1, 1],
        );
        step.ptrs = vec![Operand::Out(0, 0), Operand::In(0)];
        step.args = args;
        return Ok(vec![step]);
    }
    if spec.workspace < split_workspace(outputs as usize, splits as usize) {
        return Err(Error::Internal(format!(
            "{}: the plan's workspace ({} bytes) cannot hold {splits} partials per output",
            spec.op, spec.workspace
        )));
    }
    // Sum and mean share pass 1 (a sum per chunk); the combine divides a mean.
    let first = if spec.op == "mean" { "sum" } else { spec.op };
    let mut split = Step::new(
        format!("op_{first}_split"),
        [splits as u32, outputs as u32, 1],
        [BLOCK, 1, 1],
    );
    split.ptrs = vec![Operand::Workspace, Operand::In(0)];
    split.args = args.clone();
    let mut combine = Step::new(
        format!("op_{}_combine", spec.op),
        [outputs as u32, 1, 1],
        [BLOCK, 1, 1],
    );
    combine.ptrs = vec![Operand::Out(0, 0), Operand::Workspace];
    combine.args = args;
    Ok(vec![split, combine])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::reduce::{split_count, SPLIT_CHUNK_MIN};
    use crate::ops::TensorDesc;
    use crate::tensor::{DType, Layout};
    use crate::{Device, DeviceKind};

    fn plan(
        shape: &[usize],
        layout: Layout,
        axes: &[usize],
        op: &str,
        ws: Option<usize>,
    ) -> Result<Vec<Step>> {
        let device = Device {
            kind: DeviceKind::Cuda,
            index: 0,
        };
        let out_shape: Vec<usize> = (0..shape.len())
            .filter(|d| !axes.contains(d))
            .map(|d| shape[d])
            .collect();
        let outputs: usize = out_shape.iter().product();
        let reduced: usize = axes.iter().map(|&a| shape[a]).product();
        let x = TensorDesc::new(device, DType::F32, layout);
        let out_dtype = if op == "argmax" {
            DType::I64
        } else {
            DType::F32
        };
        let o = TensorDesc::new(device, out_dtype, Layout::contiguous(&out_shape));
        let params = Params::Reduce {
            axes: axes.to_vec(),
            keepdim: false,
        };
        let spec = PlanSpec {
            op,
            device,
            dtype: DType::F32,
            params: &params,
            inputs: std::slice::from_ref(&x),
            outputs: std::slice::from_ref(&o),
            scalars: &[],
            grid: [1, 1, 1],
            workspace: ws
                .unwrap_or_else(|| split_workspace(outputs, split_count(outputs, reduced))),
        };
        steps(&spec)
    }

    /// A few outputs over many elements take the split pass and the combine, whose chunks
    /// cover every element once, none empty; many outputs or short rows take one launch; every
    /// launch carries the parameters its entry takes; a workspace too small is refused.
    #[test]
    fn few_long_reductions_are_split_and_cover_every_element() {
        let cases: [(&[usize], Layout, &[usize]); 6] = [
            (&[1 << 24], Layout::contiguous(&[1 << 24]), &[0]),
            (&[3, 70_000], Layout::contiguous(&[3, 70_000]), &[1]),
            // Strided: the reduced axis is the outer one of a row-major [70 000, 3].
            (&[70_000, 3], Layout::contiguous(&[70_000, 3]), &[0]),
            (&[2, 128_256], Layout::contiguous(&[2, 128_256]), &[1]),
            (&[2, 32_000], Layout::contiguous(&[2, 32_000]), &[1]),
            (&[4096, 4096], Layout::contiguous(&[4096, 4096]), &[1]),
        ];
        for (shape, layout, axes) in cases {
            let outputs: i64 = (0..shape.len())
                .filter(|d| !axes.contains(d))
                .map(|d| shape[d] as i64)
                .product();
            let reduced: i64 = axes.iter().map(|&a| shape[a] as i64).product();
            for op in ["sum", "mean", "max", "min", "argmax"] {
                let steps = plan(shape, layout.clone(), axes, op, None).unwrap();
                for s in &steps {
                    assert!(FAMILY.entries.contains(&s.entry.as_str()), "{}", s.entry);
                    assert_eq!((s.ptrs.len(), s.args.0.len()), FAMILY.params, "{}", s.entry);
                }
                let words = &steps[0].args.0;
                let (splits, chunk) = (words[44], words[45]);
                if reduced < 4 * SPLIT_CHUNK_MIN as i64 || outputs > 128 {
                    assert_eq!(steps.len(), 1, "{op} {shape:?}");
                    assert_eq!(steps[0].entry, format!("op_{op}"));
                    assert_eq!((splits, chunk), (1, reduced));
                    continue;
                }
                assert_eq!(steps.len(), 2, "{op} {shape:?}");
                let first = if op == "mean" { "sum" } else { op };
                assert_eq!(steps[0].entry, format!("op_{first}_split"));
                assert_eq!(steps[1].entry, format!("op_{op}_combine"));
                assert!(
                    splits >= 2 && chunk >= SPLIT_CHUNK_MIN as i64,
                    "{op} {shape:?}"
                );
                assert!(splits * chunk >= reduced && (splits - 1) * chunk < reduced);
                assert_eq!(steps[0].grid, [splits as u32, outputs as u32, 1]);
                assert_eq!(steps[1].grid, [outputs as u32, 1, 1]);
                assert_eq!(steps[1].args.0, steps[0].args.0);
                // The workspace the generic plan asks for is just enough.
                let need = split_workspace(outputs as usize, splits as usize);
                assert!(matches!(
                    plan(shape, layout.clone(), axes, op, Some(need - 1)),
                    Err(Error::Internal(_))
                ));
            }
        }
        // A whole-tensor sum of 16 Mi elements fills 256 blocks.
        let steps = plan(
            &[1 << 24],
            Layout::contiguous(&[1 << 24]),
            &[0],
            "sum",
            None,
        )
        .unwrap();
        assert_eq!(steps[0].grid, [256, 1, 1]);
    }
}
