//! [`Graph`]: operators over tensors, made by a [`GraphBuilder`] or by recording the eager
//! Tensor API ([`crate::graph::record`](mod@crate::graph::record)).
//!
//! A graph's tensors live in **buffers**: the storage of one tensor, with a [`BufferRole`].
//! External tensors (weights, inputs, state such as a KV cache) are referenced; intermediates
//! are tensors the recording (or the builder) allocated, which [`Runtime::run`] computes into
//! and which a [`CapturePlan`](super::CapturePlan) places in one arena instead. A node reads
//! and writes [`Operand`]s: views (a layout and a dtype) of buffers.
//!
//! [`Runtime::run`]: crate::Runtime::run

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use super::named::Named;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::ops::{Plan, TensorDesc};
use crate::runtime::Runtime;
use crate::tensor::{DType, Layout, Tensor};

/// A buffer of a graph (its index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferId(pub usize);

/// What a buffer is to the graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BufferRole {
    /// An external tensor referenced by address (weights, state); the graph may write it.
    External,
    /// An external tensor fed by name: an exec copies it into a static input of its own.
    Input(String),
    /// A tensor a node produces.
    Intermediate,
}

/// One buffer: the tensor whose storage it is, and its role.
#[derive(Debug, Clone)]
pub struct Buffer {
    pub tensor: Tensor,
    pub role: BufferRole,
}

/// A view of a buffer a node reads or writes.
#[derive(Debug, Clone, PartialEq)]
pub struct Operand {
    pub buffer: BufferId,
    pub dtype: DType,
    /// The view's layout; its offset counts elements of `dtype` from the buffer's start.
    pub layout: Layout,
}

impl Operand {
    /// The operand's description on `device`.
    pub fn desc(&self, device: Device) -> TensorDesc {
        TensorDesc::new(device, self.dtype, self.layout.clone())
    }

    /// The same view of another storage placed `byte_offset` bytes into `base`.
    pub(crate) fn view_in(&self, base: &Tensor, byte_offset: usize) -> Result<Tensor> {
        let elem = self.dtype.size();
        if !byte_offset.is_multiple_of(elem) {
            return Err(Error::Internal(format!(
                "graph buffer at byte {byte_offset} is not aligned for {}",
                self.dtype
            )));
        }
        let layout = self
            .layout
            .with_offset(self.layout.offset() + byte_offset / elem);
        base.view_storage(layout, self.dtype)
    }
}

/// A host function a graph runs between device work: it sees its operands as tensors and
/// may read them back (argmax to the host) or write them (a data-dependent decision). Host
/// nodes are never captured: they end a capture-safe segment. A host step runs on the thread
/// that replays, holding its exec's turn: replaying or feeding that same exec from it is
/// refused with [`Error::WaitsForItself`].
pub type HostFn = Arc<dyn Fn(&[Tensor]) -> Result<()> + Send + Sync>;

/// What a node does.
#[derive(Clone)]
pub enum NodeKind {
    /// A planned operator, launched with the node's operands.
    Op(Plan),
    /// A host function (see [`HostFn`]).
    Host { name: String, f: HostFn },
}

/// One node: what it does, what it reads, what it writes.
#[derive(Clone)]
pub struct Node {
    pub kind: NodeKind,
    pub inputs: Vec<Operand>,
    pub outputs: Vec<Operand>,
}

impl Node {
    /// The operator's name, or the host node's.
    pub fn name(&self) -> &str {
        match &self.kind {
            NodeKind::Op(p) => p.op(),
            NodeKind::Host { name, .. } => name,
        }
    }
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ins: Vec<usize> = self.inputs.iter().map(|o| o.buffer.0).collect();
        let outs: Vec<usize> = self.outputs.iter().map(|o| o.buffer.0).collect();
        write!(f, "{}({ins:?} -> {outs:?})", self.name())
    }
}

#[derive(Clone)]
pub(crate) struct GraphInner {
    pub device: Device,
    pub buffers: Vec<Buffer>,
    pub nodes: Vec<Node>,
    /// The outputs named by the user.
    pub outputs: Named<Operand>,
    /// The buffer of each storage, by its base address (the graph holds every storage it
    /// maps, so no address is reused while it lives).
    pub by_addr: HashMap<u64, BufferId>,
    /// The buffer of each named input (the names the buffers' roles hold).
    pub input_names: HashMap<String, BufferId>,
    /// The default outputs (see [`Graph::outputs`]), found once when first asked for.
    pub default_outputs: OnceLock<Named<Operand>>,
}

/// Operators over tensors on one device. Cheap to clone (shared).
///
/// ```
/// use unirt::{graph, tensor::{DType, Tensor}, Device, Runtime};
/// let rt = Runtime::get(Device::CPU)?;
/// let x = Tensor::full(&[4], 2.0, DType::F32, Device::CPU)?;
/// rt.start_graph_recording()?;
/// let y = x.mul(&x)?.add_scalar(1.0)?;           // recorded, not run
/// let mut g = rt.stop_graph_recording()?;
/// g.mark_input("x", &x)?;
/// g.mark_output("y", &y)?;
/// rt.run(&g)?;                                   // eager, through the registry
/// assert_eq!(y.to_vec::<f32>()?, [5.0; 4]);
/// let mut exec = g.plan()?.instantiate()?;        // plan once, capture, replay
/// exec.set_input("x", &Tensor::full(&[4], 3.0, DType::F32, Device::CPU)?)?;
/// exec.replay()?;
/// assert_eq!(exec.output("y")?.to_vec::<f32>()?, [10.0; 4]);
/// # Ok::<(), unirt::Error>(())
/// ```
#[derive(Clone)]
pub struct Graph(pub(crate) Arc<GraphInner>);

impl Graph {
    pub fn device(&self) -> Device {
        self.0.device
    }

    pub fn buffers(&self) -> &[Buffer] {
        &self.0.buffers
    }

    /// The nodes in the order they were recorded (or added).
    pub fn nodes(&self) -> &[Node] {
        &self.0.nodes
    }

    /// The named outputs: those marked, or else every intermediate no node reads
    /// (`output0`, `output1`, … in buffer order).
    pub fn outputs(&self) -> Vec<(String, Operand)> {
        self.named_outputs().list().to_vec()
    }

    /// The outputs by name: those marked, else the default ones (found once).
    fn named_outputs(&self) -> &Named<Operand> {
        if !self.0.outputs.is_empty() {
            return &self.0.outputs;
        }
        self.0
            .default_outputs
            .get_or_init(|| self.default_outputs())
    }

    fn default_outputs(&self) -> Named<Operand> {
        let mut read = vec![false; self.0.buffers.len()];
        for n in &self.0.nodes {
            for o in &n.inputs {
                read[o.buffer.0] = true;
            }
        }
        let mut out = Vec::new();
        for n in &self.0.nodes {
            for o in &n.outputs {
                let b = &self.0.buffers[o.buffer.0];
                if b.role == BufferRole::Intermediate && !read[o.buffer.0] {
                    out.push((format!("output{}", out.len()), o.clone()));
                }
            }
        }
        out.into_iter().collect()
    }

    /// The named inputs.
    pub fn inputs(&self) -> Vec<(String, BufferId)> {
        self.0
            .buffers
            .iter()
            .enumerate()
            .filter_map(|(i, b)| match &b.role {
                BufferRole::Input(n) => Some((n.clone(), BufferId(i))),
                _ => None,
            })
            .collect()
    }

    /// The buffer holding `t`'s storage, if the graph uses it.
    pub fn buffer_of(&self, t: &Tensor) -> Option<BufferId> {
        let by_addr = self.0.by_addr.get(&t.base_addr()).copied();
        match by_addr.filter(|id| self.0.buffers[id.0].tensor.shares_storage(t)) {
            Some(id) => Some(id),
            // Storages without bytes may share an address; the search finds them.
            None => self
                .0
                .buffers
                .iter()
                .position(|b| b.tensor.shares_storage(t))
                .map(BufferId),
        }
    }

    fn inner_mut(&mut self) -> &mut GraphInner {
        // Copy on write: a plan made earlier keeps the graph as it was.
        let g = Arc::make_mut(&mut self.0);
        g.default_outputs = OnceLock::new();
        g
    }

    /// Names the external tensor `t` as input `name`, which an exec feeds with
    /// [`GraphExec::set_input`](super::GraphExec::set_input). `t` is the contiguous tensor
    /// that owns the storage (the nodes may read views of it: slices, transposes, reshapes);
    /// the exec's static input has its shape. Naming a named input again renames it.
    pub fn mark_input(&mut self, name: &str, t: &Tensor) -> Result<()> {
        let id = self.buffer_of(t).ok_or_else(|| {
            Error::BadParam(format!(
                "input {name:?}: the graph does not use this tensor"
            ))
        })?;
        if self.0.input_names.get(name).is_some_and(|&b| b != id) {
            return Err(Error::BadParam(format!("input {name:?} is already named")));
        }
        let g = self.inner_mut();
        let b = &mut g.buffers[id.0];
        if b.role == BufferRole::Intermediate {
            return Err(Error::BadParam(format!(
                "input {name:?}: the tensor is computed by the graph, not fed to it"
            )));
        }
        // The tensor named, not the view the graph met first (a slice or a transpose of it,
        // say), is what an exec's static input looks like and what `set_input` feeds: all of
        // the storage, so that no view the graph reads keeps stale values.
        if t.layout() != &Layout::contiguous(t.shape()) || t.nbytes() != t.storage_bytes() {
            return Err(Error::BadParam(format!(
                "input {name:?}: name the contiguous tensor that owns the storage (not a view \
                 of part of it, or of it reordered)"
            )));
        }
        b.tensor = t.clone();
        // Naming a named input again renames it.
        if let BufferRole::Input(old) = &b.role {
            g.input_names.remove(old);
        }
        b.role = BufferRole::Input(name.into());
        g.input_names.insert(name.into(), id);
        Ok(())
    }

    /// Names the tensor `t`, which a node of the graph computes, as output `name`.
    pub fn mark_output(&mut self, name: &str, t: &Tensor) -> Result<()> {
        let id = self.buffer_of(t).ok_or_else(|| {
            Error::BadParam(format!(
                "output {name:?}: the graph does not use this tensor"
            ))
        })?;
        if self.0.buffers[id.0].role != BufferRole::Intermediate {
            return Err(Error::BadParam(format!(
                "output {name:?}: the tensor is not computed by the graph"
            )));
        }
        if self.0.outputs.get(name).is_some() {
            return Err(Error::BadParam(format!("output {name:?} is already named")));
        }
        let op = Operand {
            buffer: id,
            dtype: t.dtype(),
            layout: t.layout().clone(),
        };
        self.inner_mut().outputs.insert(name, op);
        Ok(())
    }

    /// The tensor of output `name` as the graph's own buffers hold it (what [`Runtime::run`]
    /// writes).
    ///
    /// [`Runtime::run`]: crate::Runtime::run
    pub fn output(&self, name: &str) -> Result<Tensor> {
        let op = self
            .named_outputs()
            .get(name)
            .ok_or_else(|| Error::BadParam(format!("the graph has no output {name:?}")))?;
        op.view_in(&self.0.buffers[op.buffer.0].tensor, 0)
    }

    /// The tensor a node operand views in the graph's own buffers.
    pub(crate) fn tensor_of(&self, o: &Operand) -> Result<Tensor> {
        o.view_in(&self.0.buffers[o.buffer.0].tensor, 0)
    }

    /// Plans the graph for its device (see [`CapturePlan`](super::CapturePlan)).
    pub fn plan(&self) -> Result<super::CapturePlan> {
        super::CapturePlan::new(self)
    }

    /// Plans the graph and instantiates the plan with the default options: the one call
    /// between a recorded graph and its replays.
    pub fn instantiate(&self) -> Result<super::GraphExec> {
        super::GraphExec::instantiate(&self.plan()?, Default::default())
    }
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("device", &self.0.device)
            .field("buffers", &self.0.buffers.len())
            .field("nodes", &self.0.nodes)
            .finish()
    }
}

/// Builds a [`Graph`] explicitly: inputs, constants, planned operators, outputs.
///
/// ```
/// use unirt::{graph::GraphBuilder, ops, tensor::{DType, Tensor}, Device, Runtime};
/// let mut b = GraphBuilder::new(Device::CPU);
/// let x = b.input("x", &[3], DType::F32)?;
/// let two = b.constant(&Tensor::full(&[3], 2.0, DType::F32, Device::CPU)?)?;
/// let y = b.op(ops::elementwise::binary(ops::BinaryOp::Mul, &b.desc(&x), &b.desc(&two))?, &[&x, &two])?;
/// b.output("y", &y[0])?;
/// let g = b.build()?;
/// let mut exec = g.plan()?.instantiate()?;
/// exec.set_input("x", &Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], Device::CPU)?)?;
/// exec.replay()?;
/// assert_eq!(exec.output("y")?.to_vec::<f32>()?, [2.0, 4.0, 6.0]);
/// # Ok::<(), unirt::Error>(())
/// ```
pub struct GraphBuilder {
    device: Device,
    buffers: Vec<Buffer>,
    nodes: Vec<Node>,
    outputs: Named<Operand>,
    /// Buffer of each storage, by its address (the builder holds every storage it maps, so
    /// an address is not reused while the builder lives).
    by_addr: HashMap<u64, BufferId>,
    input_names: HashMap<String, BufferId>,
}

impl GraphBuilder {
    pub fn new(device: Device) -> Self {
        GraphBuilder {
            device,
            buffers: Vec::new(),
            nodes: Vec::new(),
            outputs: Named::default(),
            by_addr: HashMap::new(),
            input_names: HashMap::new(),
        }
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// The description of an operand (to plan an operator over it).
    pub fn desc(&self, o: &Operand) -> TensorDesc {
        o.desc(self.device)
    }

    fn add_buffer(&mut self, tensor: &Tensor, role: BufferRole) -> Result<BufferId> {
        if tensor.device() != self.device {
            return Err(Error::DeviceMismatch {
                op: "graph".into(),
                expected: self.device,
                got: tensor.device(),
            });
        }
        let id = BufferId(self.buffers.len());
        // The whole storage, viewed as bytes-sized elements of the tensor's dtype from 0.
        self.buffers.push(Buffer {
            tensor: tensor.clone(),
            role,
        });
        self.by_addr.insert(tensor.base_addr(), id);
        Ok(id)
    }

    /// The operand viewing `t`, adding its storage as a buffer of `role` if new.
    pub(crate) fn operand_of(&mut self, t: &Tensor, role: BufferRole) -> Result<Operand> {
        let id = match self.by_addr.get(&t.base_addr()) {
            Some(&id) if self.buffers[id.0].tensor.shares_storage(t) => id,
            _ => self.add_buffer(t, role)?,
        };
        Ok(Operand {
            buffer: id,
            dtype: t.dtype(),
            layout: t.layout().clone(),
        })
    }

    /// Whether `t`'s storage is an intermediate of this graph.
    pub(crate) fn is_intermediate(&self, t: &Tensor) -> bool {
        self.by_addr
            .get(&t.base_addr())
            .is_some_and(|id| self.buffers[id.0].role == BufferRole::Intermediate)
    }

    /// A named input of `shape` and `dtype` (a contiguous tensor the builder allocates).
    pub fn input(&mut self, name: &str, shape: &[usize], dtype: DType) -> Result<Operand> {
        if self.input_names.contains_key(name) {
            return Err(Error::BadParam(format!("input {name:?} is already named")));
        }
        let t = Tensor::zeros(shape, dtype, self.device)?;
        let o = self.operand_of(&t, BufferRole::Input(name.into()))?;
        self.input_names.insert(name.into(), o.buffer);
        Ok(o)
    }

    /// An external tensor the graph reads (or writes) by address.
    pub fn constant(&mut self, t: &Tensor) -> Result<Operand> {
        self.operand_of(t, BufferRole::External)
    }

    fn check_operand(&self, o: &Operand) -> Result<()> {
        if o.buffer.0 >= self.buffers.len() {
            return Err(Error::BadParam(
                "an operand that is not of this graph (or of another device)".into(),
            ));
        }
        Ok(())
    }

    /// Adds a planned operator over `inputs`; returns its outputs (buffers the builder
    /// allocates with the plan's output layouts: the shape and dtype inference is the plan's).
    pub fn op(&mut self, plan: Plan, inputs: &[&Operand]) -> Result<Vec<Operand>> {
        let outs = plan
            .outputs()
            .iter()
            .map(|d| Tensor::empty(d.layout.shape(), d.dtype, d.device))
            .collect::<Result<Vec<_>>>()?;
        let ins: Vec<Operand> = inputs.iter().map(|o| (*o).clone()).collect();
        let out_ops = outs
            .iter()
            .map(|t| self.operand_of(t, BufferRole::Intermediate))
            .collect::<Result<Vec<_>>>()?;
        self.push_op(plan, ins, out_ops.clone())?;
        Ok(out_ops)
    }

    /// Adds an operator writing into existing operands (an in-place update of a state
    /// buffer, for instance).
    pub fn op_into(&mut self, plan: Plan, inputs: &[&Operand], outputs: &[&Operand]) -> Result<()> {
        let ins = inputs.iter().map(|o| (*o).clone()).collect();
        let outs = outputs.iter().map(|o| (*o).clone()).collect();
        self.push_op(plan, ins, outs)
    }

    pub(crate) fn push_op(
        &mut self,
        plan: Plan,
        inputs: Vec<Operand>,
        outputs: Vec<Operand>,
    ) -> Result<()> {
        if plan.device() != self.device {
            return Err(Error::DeviceMismatch {
                op: plan.op().into(),
                expected: self.device,
                got: plan.device(),
            });
        }
        if inputs.len() != plan.inputs().len() || outputs.len() != plan.outputs().len() {
            return Err(Error::BadParam(format!(
                "{} takes {} inputs and {} outputs, got {} and {}",
                plan.op(),
                plan.inputs().len(),
                plan.outputs().len(),
                inputs.len(),
                outputs.len()
            )));
        }
        for (o, want) in inputs
            .iter()
            .zip(plan.inputs())
            .chain(outputs.iter().zip(plan.outputs()))
        {
            self.check_operand(o)?;
            if o.dtype != want.dtype || o.layout.shape() != want.layout.shape() {
                return Err(Error::ShapeMismatch {
                    op: format!("{} ({} operand)", plan.op(), o.dtype),
                    expected: want.layout.shape().to_vec(),
                    got: o.layout.shape().to_vec(),
                });
            }
            if o.layout.strides() != want.layout.strides() {
                return Err(Error::BadTensorStrides(format!(
                    "{}: planned for strides {:?}, got {:?}",
                    plan.op(),
                    want.layout.strides(),
                    o.layout.strides()
                )));
            }
            let b = &self.buffers[o.buffer.0].tensor;
            let end = o.layout.span_end().unwrap_or(0) * o.dtype.size();
            if o.layout.numel() > 0 && end > b.storage_bytes() {
                return Err(Error::BadTensorShape(format!(
                    "{}: an operand reaches past its buffer",
                    plan.op()
                )));
            }
        }
        self.nodes.push(Node {
            kind: NodeKind::Op(plan),
            inputs,
            outputs,
        });
        Ok(())
    }

    /// Adds a host function over `operands` (see [`HostFn`]); it ends a capture-safe
    /// segment.
    pub fn host_op(&mut self, name: &str, operands: &[&Operand], f: HostFn) -> Result<()> {
        for o in operands {
            self.check_operand(o)?;
        }
        // A host function may read and write its operands: it is both.
        let ops: Vec<Operand> = operands.iter().map(|o| (*o).clone()).collect();
        self.nodes.push(Node {
            kind: NodeKind::Host {
                name: name.into(),
                f,
            },
            inputs: ops.clone(),
            outputs: ops,
        });
        Ok(())
    }

    /// Names an operand a node computes as output `name`.
    pub fn output(&mut self, name: &str, o: &Operand) -> Result<()> {
        self.check_operand(o)?;
        if self.buffers[o.buffer.0].role != BufferRole::Intermediate {
            return Err(Error::BadParam(format!(
                "output {name:?}: the operand is not computed by the graph"
            )));
        }
        if !self.outputs.insert(name, o.clone()) {
            return Err(Error::BadParam(format!("output {name:?} is already named")));
        }
        Ok(())
    }

    /// The graph.
    pub fn build(self) -> Result<Graph> {
        Ok(Graph(Arc::new(GraphInner {
            device: self.device,
            buffers: self.buffers,
            nodes: self.nodes,
            outputs: self.outputs,
            by_addr: self.by_addr,
            input_names: self.input_names,
            default_outputs: OnceLock::new(),
        })))
    }
}

/// Runs every node of `graph` in order on the calling thread's stream, into the graph's own
/// buffers: the eager execution ([`Runtime::run`]).
pub(crate) fn run_eager(rt: &Runtime, graph: &Graph) -> Result<()> {
    if rt.device() != graph.device() {
        return Err(Error::DeviceMismatch {
            op: "run (graph)".into(),
            expected: rt.device(),
            got: graph.device(),
        });
    }
    if super::record::is_recording(graph.device()) {
        return Err(Error::Capturing(
            "running a graph while this thread records one".into(),
        ));
    }
    let stream = rt.stream()?;
    let mut ws: Option<Tensor> = None;
    for n in graph.nodes() {
        let ins = n
            .inputs
            .iter()
            .map(|o| graph.tensor_of(o))
            .collect::<Result<Vec<_>>>()?;
        let outs = n
            .outputs
            .iter()
            .map(|o| graph.tensor_of(o))
            .collect::<Result<Vec<_>>>()?;
        match &n.kind {
            NodeKind::Op(plan) => {
                let need = plan.workspace_size();
                if need > ws.as_ref().map_or(0, |w| w.nbytes()) {
                    ws = Some(Tensor::empty(&[need], DType::U8, graph.device())?);
                }
                let ins: Vec<&Tensor> = ins.iter().collect();
                let outs: Vec<&Tensor> = outs.iter().collect();
                let w = if need > 0 { ws.as_ref() } else { None };
                // Run, never recorded: a host step before may have started a recording.
                super::record::suspended(|| plan.launch(&ins, &outs, w, stream))?;
            }
            NodeKind::Host { f, .. } => {
                for t in &ins {
                    t.order_on(stream)?;
                }
                rt.sync_stream()?;
                f(&ins)?;
            }
        }
    }
    Ok(())
}
