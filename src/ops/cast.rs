//! `cast`: convert elements to another dtype (floats round to nearest even; float to int
//! truncates toward zero and saturates, NaN gives 0; anything to bool is `x != 0`).

use super::{out_desc, Params, Plan, PlanBuilder, TensorDesc};
use crate::error::Result;
use crate::tensor::{DType, Tensor};

/// `x` converted to `to` (the kernel is registered by the source dtype).
pub fn cast(x: &TensorDesc, to: DType) -> Result<Plan> {
    let mut p = PlanBuilder::new("cast", x.dtype, vec![x.clone()]);
    p.outputs = vec![out_desc(x.device, to, x.shape())];
    p.params = Params::Cast { to };
    p.build()
}

impl Tensor {
    /// A copy converted to `dtype` (a plain contiguous copy if it already has that dtype).
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return self.contiguous();
        }
        cast(&self.desc(), dtype)?.run1(&[self])
    }
}
