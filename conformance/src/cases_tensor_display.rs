//! How tensors print (`Display`): the same text on every device for views of every kind
//! (permuted, narrowed, broadcast, empty, scalar), clipped to 3 entries at each end of a
//! dimension and 1000 values in all; a broadcast view of 2⁴¹ elements and a tensor of
//! 100 000 dimensions print at once (the printer read the whole tensor and recursed once per
//! dimension: the latter overflowed the stack and aborted the process).

use unirt::tensor::{DType, Tensor};

use super::*;
use crate::ensure;

pub(super) const CASES: &[Case] = &[Case {
    name: "tensor::display",
    needs: &[],
    run: display,
}];

/// `t` printed, or a failure naming `what` when the text is not `header` then `values`.
fn check(t: &Tensor, header: &str, values: &str, what: &str) -> Result<(), Failure> {
    let got = t.to_string();
    let want = format!("{header} on {}\n{values}", t.device());
    ensure!(got == want, "{what}: printed\n{got}\nwant\n{want}");
    Ok(())
}

fn display(ctx: &Ctx) -> Result<(), Failure> {
    let dev = ctx.device;
    let x = Tensor::arange(0.0, 24.0, 1.0, DType::I32, dev)?.reshape(&[2, 3, 4])?;
    check(
        &x.permute(&[2, 0, 1])?,
        "Tensor[4, 2, 3] i32",
        "[[[0, 4, 8], [12, 16, 20]], [[1, 5, 9], [13, 17, 21]], [[2, 6, 10], [14, 18, 22]], \
         [[3, 7, 11], [15, 19, 23]]]",
        "a permuted view",
    )?;
    // A transposed, narrowed view (offset 1), clipped in both dimensions.
    let m = Tensor::arange(0.0, 100.0, 1.0, DType::F32, dev)?.reshape(&[10, 10])?;
    check(
        &m.transpose(0, 1)?.narrow(0, 1, 7)?,
        "Tensor[7, 10] f32",
        "[[1.0000, 11.0000, 21.0000, ..., 71.0000, 81.0000, 91.0000], \
         [2.0000, 12.0000, 22.0000, ..., 72.0000, 82.0000, 92.0000], \
         [3.0000, 13.0000, 23.0000, ..., 73.0000, 83.0000, 93.0000], ..., \
         [5.0000, 15.0000, 25.0000, ..., 75.0000, 85.0000, 95.0000], \
         [6.0000, 16.0000, 26.0000, ..., 76.0000, 86.0000, 96.0000], \
         [7.0000, 17.0000, 27.0000, ..., 77.0000, 87.0000, 97.0000]]",
        "a transposed, narrowed view",
    )?;
    let s = Tensor::full(&[], -2.5, DType::F16, dev)?;
    check(&s, "Tensor[] f16", "-2.5000", "a scalar")?;
    // 2⁴¹ elements of one value: only the printed 6 × 6 × 3 are read.
    let huge = s.broadcast_to(&[1 << 20, 1 << 20, 2, 3])?;
    let text = huge.to_string();
    ensure!(
        text.starts_with(&format!(
            "Tensor[1048576, 1048576, 2, 3] f16 on {dev}\n[[[[-2.5000, -2.5000, -2.5000], \
             [-2.5000, -2.5000, -2.5000]], [[-2.5000"
        )) && text.matches("-2.5000").count() == 6 * 6 * 2 * 3
            && text.matches("...").count() == 1 + 6,
        "a broadcast view of 2^41 elements: printed {text}"
    );
    for (shape, values) in [
        (&[2, 0, 3][..], "[[], []]"),
        (&[9, 0], "[[], [], [], ..., [], [], []]"),
        (&[0], "[]"),
    ] {
        let t = Tensor::zeros(shape, DType::Bool, dev)?;
        check(
            &t,
            &format!("Tensor{shape:?} bool"),
            values,
            "an empty tensor",
        )?;
    }
    let flags = Tensor::from_slice(&[1u8, 0, 1], &[3], dev)?
        .view_storage(unirt::tensor::Layout::contiguous(&[3]), DType::Bool)?;
    check(&flags, "Tensor[3] bool", "[1, 0, 1]", "a bool tensor")?;
    // 4096 elements in 12 dimensions of 2: the first 1000 values, then "...".
    let many = Tensor::arange(0.0, 4096.0, 1.0, DType::I64, dev)?.reshape(&[2; 12])?;
    let text = many.to_string();
    ensure!(
        text.starts_with(&format!(
            "Tensor{:?} i64 on {dev}\n{}0, 1], [2, 3]], [[4, 5]",
            [2; 12],
            "[".repeat(12)
        )) && text.ends_with(&format!("[[996, 997], [998, 999]]], ...{}", "]".repeat(9)))
            && text
                .split_once('\n')
                .is_some_and(|(_, v)| v.matches(", ").count() == 1000),
        "4096 values in 12 dimensions: printed {}…{}",
        &text[..text.len().min(300)],
        &text[text.len().saturating_sub(300)..]
    );
    // 100 000 dimensions, all but the last of size 1.
    let mut shape = vec![1; 100_000];
    shape[99_999] = 2;
    let deep = Tensor::arange(7.0, 9.0, 1.0, DType::I32, dev)?.reshape(&shape)?;
    let text = deep.to_string();
    let values = format!("{}7, 8{}", "[".repeat(100_000), "]".repeat(100_000));
    ensure!(
        text.ends_with(&format!(" i32 on {dev}\n{values}")),
        "100 000 dimensions: printed …{}",
        &text[text.len().saturating_sub(300)..]
    );
    Ok(())
}
