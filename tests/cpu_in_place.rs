//! CPU softmax, rms_norm and rope launched in place (output = the input's very view) give exactly the
//! out-of-place results: contiguous f32 lanes take separate in-place and input→output paths.

use unirt::ops::{self, Plan};
use unirt::tensor::{DType, Tensor};
use unirt::{Device, Runtime};

fn cpu() -> Device {
    "cpu:0".parse().expect("cpu:0 parses")
}

/// Runs `plan` on `ins` out of place and in place (input 0 overwritten); returns both outputs.
fn both_ways(plan: &Plan, ins: &[&Tensor]) -> unirt::Result<(Vec<f32>, Vec<f32>)> {
    let rt = Runtime::get(cpu())?;
    let s = rt.stream()?;
    let out = Tensor::empty(ins[0].shape(), DType::F32, cpu())?;
    plan.launch(ins, &[&out], None, s)?;
    let copy = Tensor::from_slice(&ins[0].to_vec::<f32>()?, ins[0].shape(), cpu())?;
    let mut in_place_ins = ins.to_vec();
    in_place_ins[0] = &copy;
    plan.launch(&in_place_ins, &[&copy], None, s)?;
    rt.sync_stream()?;
    Ok((out.to_vec()?, copy.to_vec()?))
}

#[test]
fn softmax_in_place_matches_out_of_place() -> unirt::Result<()> {
    // 37 columns: two 16-wide steps and a remainder of 5; 45: an 8-wide step before it;
    // rows of several lengths of visible keys.
    for cols in [37, 45] {
        let x = Tensor::rand_uniform(&[5, cols], -4.0, 4.0, 1, DType::F32, cpu())?;
        for plan in [
            ops::softmax::softmax(&x.desc(), -1, false)?,
            ops::softmax::softmax(&x.desc(), -1, true)?,
            ops::softmax::causal_softmax(&x.desc(), Some(3))?,
        ] {
            let (out, in_place) = both_ways(&plan, &[&x])?;
            assert_eq!(out, in_place);
            let first_row: f32 = out[..cols].iter().sum();
            assert!(out.iter().all(|v| v.is_finite()) && first_row != 0.0);
        }
    }
    Ok(())
}

#[test]
fn rms_norm_in_place_matches_out_of_place() -> unirt::Result<()> {
    let x = Tensor::rand_uniform(&[4, 37], -2.0, 2.0, 3, DType::F32, cpu())?;
    let w = Tensor::rand_uniform(&[37], 0.5, 1.5, 4, DType::F32, cpu())?;
    let plan = ops::norm::rms_norm(&x.desc(), &w.desc(), 1e-6)?;
    let (out, in_place) = both_ways(&plan, &[&x, &w])?;
    assert_eq!(out, in_place);
    assert_ne!(out, x.to_vec::<f32>()?);
    Ok(())
}

#[test]
fn rope_in_place_matches_out_of_place() -> unirt::Result<()> {
    let x = Tensor::rand_uniform(&[6, 3, 10], -1.0, 1.0, 2, DType::F32, cpu())?;
    let pos = Tensor::from_slice(&[0i64, 5, 1, 9, 2, 7], &[6], cpu())?;
    for interleaved in [false, true] {
        let plan = ops::rope::rope(&x.desc(), &pos.desc(), 10000.0, interleaved)?;
        let (out, in_place) = both_ways(&plan, &[&x, &pos])?;
        assert_eq!(out, in_place);
        // Position 0 rotates by nothing; position 5 does rotate.
        let xs = x.to_vec::<f32>()?;
        assert_eq!(&out[..30], &xs[..30]);
        assert_ne!(&out[30..60], &xs[30..60]);
    }
    Ok(())
}

/// Outputs past the last-level cache's share are written with non-temporal stores from a
/// row buffer; in place they are not. Rows of 128 (whole cache lines) and of 40 (rows that
/// start and end inside lines), both rotary layouts, 16 MiB each: the same bits either way.
#[test]
fn large_rope_streamed_matches_in_place() -> unirt::Result<()> {
    for (heads, d) in [(32, 128), (8, 40)] {
        let seq = (16 << 20) / (4 * heads * d) + 1;
        let x = Tensor::rand_uniform(&[seq, heads, d], -1.0, 1.0, 3, DType::F32, cpu())?;
        let ids: Vec<i64> = (0..seq as i64).rev().collect();
        let pos = Tensor::from_slice(&ids, &[seq], cpu())?;
        for interleaved in [false, true] {
            let plan = ops::rope::rope(&x.desc(), &pos.desc(), 10000.0, interleaved)?;
            let (out, in_place) = both_ways(&plan, &[&x, &pos])?;
            assert!(
                out == in_place,
                "heads {heads}, d {d}, interleaved {interleaved}"
            );
        }
    }
    Ok(())
}

/// rms_norm outputs past the last-level cache's share are written with non-temporal stores
/// from each row's first 64-byte boundary on; in place they are not. Rows of 4096 (whole
/// lines), of 4196 (a pitch 16 bytes past a multiple of 64: rows start at every offset
/// within a line) and of 37, 16 MiB each: the same bits either way.
#[test]
fn large_rms_norm_streamed_matches_in_place() -> unirt::Result<()> {
    for d in [4096, 4196, 37] {
        let rows = (16 << 20) / (4 * d) + 1;
        let x = Tensor::rand_uniform(&[rows, d], -2.0, 2.0, 5, DType::F32, cpu())?;
        let w = Tensor::rand_uniform(&[d], 0.5, 1.5, 6, DType::F32, cpu())?;
        let plan = ops::norm::rms_norm(&x.desc(), &w.desc(), 1e-6)?;
        let (out, in_place) = both_ways(&plan, &[&x, &w])?;
        assert!(out == in_place, "rows of {d}");
    }
    Ok(())
}
