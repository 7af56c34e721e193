//! [`CapturePlan`]: the fixed execution strategy of a [`Graph`] on its device, paid for once.
//!
//! 1. **Order**: a topological order of the nodes over their buffer dependencies
//!    (read-after-write, write-after-read, write-after-write), stable (recording order where
//!    the dependencies allow nothing else).
//! 2. **Fusion**: a matmul and the elementwise steps after it become one `matmul_epilogue`
//!    step, and chains of elementwise operators one `fused_elementwise` step, where the
//!    device registers the kernel ([`super::fusion`]).
//! 3. **Capture safety**: each step is capture-safe or not — host nodes (reads back to the
//!    host, data-dependent decisions) and kernels the backend cannot record are not — and the
//!    steps split into maximal segments of one kind.
//! 4. **Memory**: intermediates get offsets in one arena by liveness ([`super::memory`]).
//! 5. **Descriptors and workspace**: every step's [`Plan`](crate::ops::Plan) exists (the
//!    fused ones are planned here) and the one workspace is sized for the largest.

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;

use super::fusion::{fuse_chains, fuse_epilogues};
use super::graph::{BufferId, BufferRole, Graph, NodeKind, Operand};
use super::memory::{plan_memory, Lifetime, MemoryPlan};
use crate::error::{Error, Result};
use crate::hal::Backend;
use crate::ops::KernelImpl;

/// One step of a plan: a node of the graph, or a fused chain of them.
#[derive(Clone, Debug)]
pub struct Step {
    pub kind: NodeKind,
    pub inputs: Vec<Operand>,
    pub outputs: Vec<Operand>,
    /// The graph nodes this step runs (several for a fused chain).
    pub nodes: Vec<usize>,
    /// Why the step cannot be captured (`None`: capture-safe).
    pub unsafe_reason: Option<String>,
}

impl Step {
    pub fn name(&self) -> &str {
        match &self.kind {
            NodeKind::Op(p) => p.op(),
            NodeKind::Host { name, .. } => name,
        }
    }

    pub fn is_capture_safe(&self) -> bool {
        self.unsafe_reason.is_none()
    }
}

impl std::fmt::Debug for NodeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeKind::Op(p) => write!(f, "Op({})", p.op()),
            NodeKind::Host { name, .. } => write!(f, "Host({name})"),
        }
    }
}

/// A run of steps that are all capture-safe (replayed as one captured graph) or all not
/// (run eagerly).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub capture_safe: bool,
    pub steps: Range<usize>,
}

/// How to plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanOptions {
    /// Fuse elementwise chains where the device has the kernel (default true).
    pub fuse: bool,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions { fuse: true }
    }
}

/// The plan of a graph on its device; instantiate it into a
/// [`GraphExec`](super::GraphExec) (as often as wanted).
#[derive(Debug, Clone)]
pub struct CapturePlan {
    pub(crate) graph: Graph,
    pub(crate) steps: Vec<Step>,
    pub(crate) segments: Vec<Segment>,
    pub(crate) memory: MemoryPlan,
    /// Distinct, ascending (see [`CapturePlan::workspace_sizes`]).
    pub(crate) workspace_sizes: Vec<usize>,
    pub(crate) outputs: Vec<(String, Operand)>,
    pub(crate) fused_chains: usize,
    pub(crate) fused_epilogues: usize,
}

/// A stable topological order of the graph's nodes.
fn topological_order(graph: &Graph) -> Result<Vec<usize>> {
    let nodes = graph.nodes();
    let n = nodes.len();
    let mut deps: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n];
    let mut last_write: HashMap<BufferId, usize> = HashMap::new();
    let mut reads_since: HashMap<BufferId, Vec<usize>> = HashMap::new();
    for (i, node) in nodes.iter().enumerate() {
        for o in &node.inputs {
            if let Some(&w) = last_write.get(&o.buffer) {
                deps[i].insert(w);
            }
        }
        for o in &node.outputs {
            if let Some(&w) = last_write.get(&o.buffer) {
                deps[i].insert(w);
            }
            for &r in reads_since.get(&o.buffer).into_iter().flatten() {
                if r != i {
                    deps[i].insert(r);
                }
            }
        }
        for o in &node.inputs {
            reads_since.entry(o.buffer).or_default().push(i);
        }
        for o in &node.outputs {
            last_write.insert(o.buffer, i);
            reads_since.insert(o.buffer, Vec::new());
        }
    }
    // Kahn's algorithm, always taking the lowest ready index.
    let mut remaining: Vec<usize> = deps.iter().map(|d| d.len()).collect();
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, d) in deps.iter().enumerate() {
        for &j in d {
            users[j].push(i);
        }
    }
    let mut ready: BTreeSet<usize> = (0..n).filter(|&i| remaining[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &u in &users[i] {
            remaining[u] -= 1;
            if remaining[u] == 0 {
                ready.insert(u);
            }
        }
    }
    if order.len() != n {
        return Err(Error::Internal("graph: a dependency cycle".into()));
    }
    Ok(order)
}

/// Why a step cannot be captured on the device, if it cannot.
fn capture_hazard(graph: &Graph, kind: &NodeKind, can_capture: bool) -> Option<String> {
    match kind {
        NodeKind::Host { name, .. } => Some(format!("host function {name:?}")),
        NodeKind::Op(_) if !can_capture => Some(format!(
            "{} does not support stream capture",
            graph.device()
        )),
        NodeKind::Op(p) => match crate::ops::lookup(p.op(), graph.device().kind, p.dtype()) {
            Ok(KernelImpl::Host(_) | KernelImpl::HostPerItem(_) | KernelImpl::Prepared { .. }) => {
                None
            }
            Ok(k) => Some(format!(
                "{} kernel of {} is not recordable",
                k.source_kind(),
                p.op()
            )),
            Err(e) => Some(e.to_string()),
        },
    }
}

impl CapturePlan {
    /// Plans `graph` with the default options.
    pub fn new(graph: &Graph) -> Result<CapturePlan> {
        Self::with_options(graph, PlanOptions::default())
    }

    /// Plans `graph`.
    pub fn with_options(graph: &Graph, options: PlanOptions) -> Result<CapturePlan> {
        if graph.nodes().is_empty() {
            return Err(Error::BadParam("planning an empty graph".into()));
        }
        let order = topological_order(graph)?;
        let steps: Vec<Step> = order
            .iter()
            .map(|&i| {
                let n = &graph.nodes()[i];
                Step {
                    kind: n.kind.clone(),
                    inputs: n.inputs.clone(),
                    outputs: n.outputs.clone(),
                    nodes: vec![i],
                    unsafe_reason: None,
                }
            })
            .collect();
        let outputs = graph.outputs();
        let keep: Vec<BufferId> = outputs.iter().map(|(_, o)| o.buffer).collect();
        let (mut steps, fused_epilogues, fused_chains) = if options.fuse {
            let (steps, epilogues) = fuse_epilogues(graph, steps, &keep)?;
            let (steps, chains) = fuse_chains(graph, steps, &keep)?;
            (steps, epilogues, chains)
        } else {
            (steps, 0, 0)
        };
        let can_capture = crate::open(graph.device())?.info().capabilities.capture;
        for s in &mut steps {
            s.unsafe_reason = capture_hazard(graph, &s.kind, can_capture);
        }
        let mut segments: Vec<Segment> = Vec::new();
        for (i, s) in steps.iter().enumerate() {
            match segments.last_mut() {
                Some(seg) if seg.capture_safe == s.is_capture_safe() => seg.steps.end = i + 1,
                _ => segments.push(Segment {
                    capture_safe: s.is_capture_safe(),
                    steps: i..i + 1,
                }),
            }
        }
        // Liveness of every intermediate the steps touch.
        let mut life: HashMap<usize, Lifetime> = HashMap::new();
        for (i, s) in steps.iter().enumerate() {
            for o in s.inputs.iter().chain(&s.outputs) {
                let b = &graph.buffers()[o.buffer.0];
                if b.role != BufferRole::Intermediate {
                    continue;
                }
                let lt = life.entry(o.buffer.0).or_insert(Lifetime {
                    buffer: o.buffer.0,
                    bytes: b.tensor.storage_bytes(),
                    first: i,
                    last: i,
                });
                lt.last = i;
            }
        }
        for b in &keep {
            if let Some(lt) = life.get_mut(&b.0) {
                lt.last = usize::MAX;
            }
        }
        let mut lifetimes: Vec<Lifetime> = life.into_values().collect();
        lifetimes.sort_by_key(|l| l.buffer);
        let memory = plan_memory(&lifetimes);
        let mut workspace_sizes: Vec<usize> = steps
            .iter()
            .filter_map(|s| match &s.kind {
                NodeKind::Op(p) if p.workspace_size() > 0 => Some(p.workspace_size()),
                _ => None,
            })
            .collect();
        workspace_sizes.sort_unstable();
        workspace_sizes.dedup();
        Ok(CapturePlan {
            graph: graph.clone(),
            steps,
            segments,
            memory,
            workspace_sizes,
            outputs,
            fused_chains,
            fused_epilogues,
        })
    }

    pub fn device(&self) -> crate::Device {
        self.graph.device()
    }

    /// The steps in execution order.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// The maximal capture-safe and unsafe segments, in order.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The arena layout of the intermediates.
    pub fn memory(&self) -> &MemoryPlan {
        &self.memory
    }

    /// Bytes of the one workspace every step shares (the largest any step takes).
    pub fn workspace_size(&self) -> usize {
        self.workspace_sizes.last().copied().unwrap_or(0)
    }

    /// The distinct workspace sizes the steps take, ascending (an exec in exact memory
    /// allocates one block of each).
    pub fn workspace_sizes(&self) -> &[usize] {
        &self.workspace_sizes
    }

    /// How many elementwise chains became one fused step.
    pub fn fused_chains(&self) -> usize {
        self.fused_chains
    }

    /// How many matmuls took the elementwise steps after them as their epilogue.
    pub fn fused_epilogues(&self) -> usize {
        self.fused_epilogues
    }

    /// Instantiates the plan (see [`GraphExec::instantiate`](super::GraphExec::instantiate)).
    pub fn instantiate(&self) -> Result<super::GraphExec> {
        super::GraphExec::instantiate(self, super::ExecOptions::default())
    }

    /// Instantiates the plan with `options`.
    pub fn instantiate_with(&self, options: super::ExecOptions) -> Result<super::GraphExec> {
        super::GraphExec::instantiate(self, options)
    }
}
