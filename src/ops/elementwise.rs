//! Elementwise operators with NumPy broadcasting: binary (tensor–tensor and tensor–scalar),
//! unary, swiglu, where and masked_fill. Outputs are contiguous in the broadcast shape; an
//! output may be the very same view as an input (in place).

use super::{out_desc, same_device_dtype, Params, Plan, PlanBuilder, TensorDesc};
use crate::error::{Error, Result};
use crate::tensor::{broadcast_shapes, DType, Tensor};

/// Binary operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Maximum,
    Minimum,
    Pow,
}

impl BinaryOp {
    pub const ALL: [BinaryOp; 7] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
        BinaryOp::Pow,
    ];

    /// The registry name of the tensor–tensor form.
    pub const fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
            BinaryOp::Pow => "pow",
        }
    }

    /// The registry name of the tensor–scalar form (`x op s`).
    pub const fn scalar_name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add_scalar",
            BinaryOp::Sub => "sub_scalar",
            BinaryOp::Mul => "mul_scalar",
            BinaryOp::Div => "div_scalar",
            BinaryOp::Maximum => "maximum_scalar",
            BinaryOp::Minimum => "minimum_scalar",
            BinaryOp::Pow => "pow_scalar",
        }
    }

    /// The operator in `f64`, the reference every kernel is checked against, special values
    /// included: IEEE arithmetic, `maximum` and `minimum` NaN for a NaN operand (not
    /// `fmax`'s other operand, as PyTorch), `pow` as C's `pow` (`x^0 = 1` and `1^y = 1` even
    /// for NaN; a negative base to an integer power is real).
    pub fn eval(self, a: f64, b: f64) -> f64 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::Maximum | BinaryOp::Minimum if a.is_nan() || b.is_nan() => a + b,
            BinaryOp::Maximum => a.max(b),
            BinaryOp::Minimum => a.min(b),
            BinaryOp::Pow => a.powf(b),
        }
    }
}

/// Unary operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Sin,
    Cos,
    Tanh,
    Sigmoid,
    Relu,
    /// `x·Φ(x)` with the exact normal CDF (erf).
    Gelu,
    /// The tanh approximation of GELU.
    GeluTanh,
    Silu,
}

impl UnaryOp {
    pub const ALL: [UnaryOp; 14] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Gelu,
        UnaryOp::GeluTanh,
        UnaryOp::Silu,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Relu => "relu",
            UnaryOp::Gelu => "gelu",
            UnaryOp::GeluTanh => "gelu_tanh",
            UnaryOp::Silu => "silu",
        }
    }

    /// The operator in `f64`, the reference every kernel is checked against, special values
    /// included: the formula's IEEE result (so `silu(−∞)` is `−∞ / ∞`, NaN), and `relu` of
    /// NaN is NaN.
    pub fn eval(self, x: f64) -> f64 {
        match self {
            UnaryOp::Neg => -x,
            UnaryOp::Abs => x.abs(),
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Rsqrt => 1.0 / x.sqrt(),
            UnaryOp::Sin => x.sin(),
            UnaryOp::Cos => x.cos(),
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            UnaryOp::Relu if x.is_nan() => x,
            UnaryOp::Relu => x.max(0.0),
            UnaryOp::Gelu => 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)),
            UnaryOp::GeluTanh => {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
            }
            UnaryOp::Silu => x / (1.0 + (-x).exp()),
        }
    }
}

/// `a op b` with broadcasting.
pub fn binary(op: BinaryOp, a: &TensorDesc, b: &TensorDesc) -> Result<Plan> {
    let (device, dtype) = same_device_dtype(op.name(), &[a, b])?;
    let shape = broadcast_shapes(op.name(), a.shape(), b.shape())?;
    let mut p = PlanBuilder::new(op.name(), dtype, vec![a.clone(), b.clone()]);
    p.outputs = vec![out_desc(device, dtype, &shape)];
    p.in_place = true;
    p.build()
}

/// `a op s` for a scalar `s`.
pub fn binary_scalar(op: BinaryOp, a: &TensorDesc, s: f64) -> Result<Plan> {
    let mut p = PlanBuilder::new(op.scalar_name(), a.dtype, vec![a.clone()]);
    p.outputs = vec![out_desc(a.device, a.dtype, a.shape())];
    p.params = Params::Scalar(s);
    p.in_place = true;
    p.build()
}

/// `op(a)`.
pub fn unary(op: UnaryOp, a: &TensorDesc) -> Result<Plan> {
    let mut p = PlanBuilder::new(op.name(), a.dtype, vec![a.clone()]);
    p.outputs = vec![out_desc(a.device, a.dtype, a.shape())];
    p.in_place = true;
    p.build()
}

/// `up · silu(gate)` with broadcasting (InfiniCore's SwiGLU: `c = a · b · σ(b)`).
pub fn swiglu(up: &TensorDesc, gate: &TensorDesc) -> Result<Plan> {
    let (device, dtype) = same_device_dtype("swiglu", &[up, gate])?;
    let shape = broadcast_shapes("swiglu", up.shape(), gate.shape())?;
    let mut p = PlanBuilder::new("swiglu", dtype, vec![up.clone(), gate.clone()]);
    p.outputs = vec![out_desc(device, dtype, &shape)];
    p.in_place = true;
    p.build()
}

fn check_mask(op: &str, mask: &TensorDesc) -> Result<()> {
    if !matches!(mask.dtype, DType::Bool | DType::U8) {
        return Err(Error::DTypeMismatch {
            op: format!("{op} (condition)"),
            expected: DType::Bool,
            got: mask.dtype,
        });
    }
    Ok(())
}

/// `cond ? a : b` elementwise, all three broadcast together; `cond` is bool or u8.
pub fn where_(cond: &TensorDesc, a: &TensorDesc, b: &TensorDesc) -> Result<Plan> {
    check_mask("where", cond)?;
    let (device, dtype) = same_device_dtype("where", &[a, b])?;
    if cond.device != device {
        return Err(Error::DeviceMismatch {
            op: "where (condition)".into(),
            expected: device,
            got: cond.device,
        });
    }
    let shape = broadcast_shapes("where", a.shape(), b.shape())?;
    let shape = broadcast_shapes("where", cond.shape(), &shape)?;
    let mut p = PlanBuilder::new("where", dtype, vec![cond.clone(), a.clone(), b.clone()]);
    p.outputs = vec![out_desc(device, dtype, &shape)];
    p.in_place = true;
    p.build()
}

/// `mask ? value : x`; the mask broadcasts to `x`'s shape.
pub fn masked_fill(x: &TensorDesc, mask: &TensorDesc, value: f64) -> Result<Plan> {
    check_mask("masked_fill", mask)?;
    let shape = broadcast_shapes("masked_fill", x.shape(), mask.shape())?;
    if shape != x.shape() {
        return Err(Error::NotBroadcastable {
            op: "masked_fill (mask to input)".into(),
            lhs: mask.shape().to_vec(),
            rhs: x.shape().to_vec(),
        });
    }
    let mut p = PlanBuilder::new("masked_fill", x.dtype, vec![x.clone(), mask.clone()]);
    p.outputs = vec![out_desc(x.device, x.dtype, x.shape())];
    p.params = Params::Scalar(value);
    p.in_place = true;
    p.build()
}

macro_rules! binary_methods {
    ($($name:ident, $sname:ident => $op:ident;)*) => {
        impl Tensor {
            $(
                #[doc = concat!("`self ", stringify!($name), " other` with broadcasting.")]
                pub fn $name(&self, other: &Tensor) -> Result<Tensor> {
                    binary(BinaryOp::$op, &self.desc(), &other.desc())?.run1(&[self, other])
                }
                #[doc = concat!("`", stringify!($name), "` with a scalar right-hand side.")]
                pub fn $sname(&self, s: f64) -> Result<Tensor> {
                    binary_scalar(BinaryOp::$op, &self.desc(), s)?.run1(&[self])
                }
            )*
        }
    };
}

binary_methods! {
    add, add_scalar => Add;
    sub, sub_scalar => Sub;
    mul, mul_scalar => Mul;
    div, div_scalar => Div;
    maximum, maximum_scalar => Maximum;
    minimum, minimum_scalar => Minimum;
    pow, pow_scalar => Pow;
}

macro_rules! unary_methods {
    ($($name:ident => $op:ident;)*) => {
        impl Tensor {
            $(
                #[doc = concat!("Elementwise `", stringify!($name), "`.")]
                pub fn $name(&self) -> Result<Tensor> {
                    unary(UnaryOp::$op, &self.desc())?.run1(&[self])
                }
            )*
        }
    };
}

unary_methods! {
    neg => Neg; abs => Abs; exp => Exp; log => Log; sqrt => Sqrt; rsqrt => Rsqrt;
    sin => Sin; cos => Cos; tanh => Tanh; sigmoid => Sigmoid; relu => Relu;
    gelu => Gelu; gelu_tanh => GeluTanh; silu => Silu;
}

impl Tensor {
    /// `self · silu(gate)` (the gated feed-forward of Llama: `up.swiglu(&gate)`).
    pub fn swiglu(&self, gate: &Tensor) -> Result<Tensor> {
        swiglu(&self.desc(), &gate.desc())?.run1(&[self, gate])
    }

    /// `self ? a : b` for a bool/u8 condition tensor `self`.
    pub fn where_(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        where_(&self.desc(), &a.desc(), &b.desc())?.run1(&[self, a, b])
    }

    /// `value` where `mask` is set, `self` elsewhere.
    pub fn masked_fill(&self, mask: &Tensor, value: f64) -> Result<Tensor> {
        masked_fill(&self.desc(), &mask.desc(), value)?.run1(&[self, mask])
    }
}
