//! Host writes into existing tensors (`Tensor::copy_from_slice`): in place for contiguous
//! views, through a device copy for strided ones, in stream order, refused with typed errors
//! for a wrong length, dtype or bool value, a broadcast view and while a graph is recorded.
//! Host reads while a graph is recorded: an external tensor's values, whatever its layout,
//! with nothing added to the graph; a tensor the recording produced, refused.

use half::f16;
use unirt::tensor::{DType, Tensor};

use super::*;
use crate::ensure;

pub(super) const CASES: &[Case] = &[
    Case {
        name: "tensor::copy_from_slice",
        needs: &[],
        run: copy_from_slice,
    },
    Case {
        name: "tensor::copy_from_slice::bad_input",
        needs: &[],
        run: bad_input,
    },
    Case {
        name: "tensor::read_while_recording",
        needs: &[],
        run: read_while_recording,
    },
];

fn copy_from_slice(ctx: &Ctx) -> Result<(), Failure> {
    let dev = ctx.device;
    // Whole tensors of several dtypes, odd lengths.
    let t = Tensor::zeros(&[7, 37], DType::F32, dev)?;
    let v: Vec<f32> = (0..7 * 37).map(|i| i as f32 * 0.5 - 9.0).collect();
    t.copy_from_slice(&v)?;
    ensure!(t.to_vec::<f32>()? == v, "f32 [7, 37]: read back differs");
    let t = Tensor::zeros(&[3, 5], DType::I64, dev)?;
    let v: Vec<i64> = (0..15).map(|i| (i - 7) * 1_000_000_007).collect();
    t.copy_from_slice(&v)?;
    ensure!(t.to_vec::<i64>()? == v, "i64 [3, 5]: read back differs");
    let t = Tensor::zeros(&[9], DType::F16, dev)?;
    let v: Vec<f16> = (0..9).map(|i| f16::from_f32(i as f32 / 3.0)).collect();
    t.copy_from_slice(&v)?;
    ensure!(t.to_vec::<f16>()? == v, "f16 [9]: read back differs");
    let t = Tensor::zeros(&[5], DType::Bool, dev)?;
    t.copy_from_slice(&[1u8, 0, 1, 1, 0])?;
    ensure!(
        t.to_vec::<u8>()? == [1, 0, 1, 1, 0],
        "bool [5] written as u8: read back differs"
    );

    // A strided bool view (every other element), written as u8.
    let base = Tensor::zeros(&[6], DType::Bool, dev)?;
    let every_other = base.reshape(&[3, 2])?.narrow(1, 1, 1)?;
    every_other.copy_from_slice(&[1u8, 1, 0])?;
    ensure!(
        base.to_vec::<u8>()? == [0, 1, 0, 1, 0, 0],
        "strided bool view: the base holds {:?}",
        base.to_vec::<u8>()?
    );

    // A contiguous view at an offset (rows 1..3 of 4): the other rows keep their values.
    let base = Tensor::full(&[4, 5], 7.0, DType::F32, dev)?;
    let rows: Vec<f32> = (0..10).map(|i| i as f32).collect();
    base.narrow(0, 1, 2)?.copy_from_slice(&rows)?;
    let got = base.to_vec::<f32>()?;
    let mut want = vec![7.0f32; 20];
    want[5..15].copy_from_slice(&rows);
    ensure!(got == want, "rows 1..3 of [4, 5]: got {got:?}");

    // A strided view (a transpose): row-major over the view's shape.
    let base = Tensor::zeros(&[3, 4], DType::F32, dev)?;
    let view = base.transpose(0, 1)?; // [4, 3]
    let v: Vec<f32> = (0..12).map(|i| i as f32 + 1.0).collect();
    view.copy_from_slice(&v)?;
    ensure!(
        view.to_vec::<f32>()? == v,
        "transposed view: read back through the view differs"
    );
    let got = base.to_vec::<f32>()?;
    let want: Vec<f32> = (0..12).map(|i| v[(i % 4) * 3 + i / 4]).collect();
    ensure!(got == want, "transposed view: the base holds {got:?}");

    // Stream order: a device copy into the tensor queued first is overwritten by the host
    // write, and an operator queued after the write reads it.
    let n = 1 << 20;
    let ones = Tensor::full(&[n], 1.0, DType::F32, dev)?;
    let t = Tensor::zeros(&[n], DType::F32, dev)?;
    let v: Vec<f32> = (0..n).map(|i| (i % 1001) as f32).collect();
    for round in 0..3 {
        t.copy_from(&ones)?;
        t.copy_from_slice(&v)?;
        let doubled = t.mul_scalar(2.0)?.to_vec::<f32>()?;
        let bad = doubled.iter().zip(&v).position(|(d, x)| *d != 2.0 * x);
        ensure!(
            bad.is_none(),
            "round {round}: element {bad:?} of 2·t is not twice the written value (the queued \
             copy landed after the host write, or the multiply ran before it)"
        );
    }

    // Empty tensors take empty slices.
    Tensor::zeros(&[0, 3], DType::F32, dev)?.copy_from_slice::<f32>(&[])?;
    Ok(())
}

fn bad_input(ctx: &Ctx) -> Result<(), Failure> {
    let dev = ctx.device;
    let t = Tensor::full(&[2, 3], 5.0, DType::F32, dev)?;
    expect_err(
        t.copy_from_slice(&[1.0f32; 5]),
        &["shape_mismatch"],
        "5 values into [2, 3]",
    )?;
    expect_err(
        t.copy_from_slice(&[1.0f32; 7]),
        &["shape_mismatch"],
        "7 values into [2, 3]",
    )?;
    expect_err(
        t.copy_from_slice(&[1i32; 6]),
        &["dtype_mismatch"],
        "i32 values into an f32 tensor",
    )?;
    let b = Tensor::zeros(&[3], DType::Bool, dev)?;
    expect_err(
        b.copy_from_slice(&[0u8, 2, 1]),
        &["bad_param"],
        "the value 2 into a bool tensor",
    )?;
    ensure!(
        b.to_vec::<u8>()? == [0, 0, 0],
        "a refused bool write changed the tensor"
    );
    // A broadcast view repeats elements: no single value per element can be written.
    let row = Tensor::zeros(&[1, 3], DType::F32, dev)?;
    expect_err(
        row.broadcast_to(&[4, 3])?.copy_from_slice(&[1.0f32; 12]),
        &["aliasing"],
        "12 values into a [1, 3] row broadcast to [4, 3]",
    )?;
    ensure!(
        row.to_vec::<f32>()? == [0.0; 3],
        "a refused broadcast write changed the row"
    );
    // While recording: refused (a replay could not repeat it), and nothing is written.
    let (_g, r) = unirt::graph::record(dev, || Ok(t.copy_from_slice(&[1.0f32; 6])))?;
    expect_err(r, &["capturing"], "copy_from_slice while recording")?;
    ensure!(
        t.to_vec::<f32>()? == [5.0; 6],
        "a refused write changed the tensor"
    );
    Ok(())
}

/// Reads while this thread records a graph on the device. A strided view is copied before it
/// is read; that copy was recorded into the graph, and the read returned its memory, which the
/// graph had not yet written (zeros or stale values), with no error.
fn read_while_recording(ctx: &Ctx) -> Result<(), Failure> {
    let dev = ctx.device;
    let x = Tensor::arange(0.0, 6.0, 1.0, DType::F32, dev)?.reshape(&[2, 3])?;
    let want_t = [0.0f32, 3.0, 1.0, 4.0, 2.0, 5.0];
    let (g, (y, read, text, text_y)) = unirt::graph::record(dev, || {
        let y = x.exp()?;
        let read = x.transpose(0, 1)?.to_vec::<f32>();
        let text = x.transpose(0, 1)?.to_string();
        let text_y = y.to_string();
        Ok((y, read, text, text_y))
    })?;
    ensure!(
        read.as_ref().is_ok_and(|v| v == &want_t),
        "a transposed external tensor read while recording: {read:?}, want {want_t:?}"
    );
    ensure!(
        text.ends_with("[[0.0000, 3.0000], [1.0000, 4.0000], [2.0000, 5.0000]]"),
        "a transposed external tensor printed while recording: {text}"
    );
    ensure!(
        text_y.contains("values unavailable") && text_y.contains("recording"),
        "a tensor the recording produced printed values before any run: {text_y}"
    );
    ensure!(
        g.nodes().len() == 1,
        "reads while recording added nodes: the graph has {} nodes, want 1 (exp)",
        g.nodes().len()
    );
    unirt::Runtime::get(dev)?.run(&g)?;
    let want: Vec<f32> = (0..6).map(|i| (i as f32).exp()).collect();
    let got = y.to_vec::<f32>()?;
    ensure!(
        got.iter()
            .zip(&want)
            .all(|(g, w)| (g - w).abs() <= 1e-5 * w),
        "the graph's exp after the reads: {got:?}, want {want:?}"
    );
    Ok(())
}
