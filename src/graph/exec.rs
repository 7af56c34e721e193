//! [`GraphExec`]: a [`CapturePlan`] instantiated on its device and replayed.
//!
//! Instantiating allocates, and holds while the exec lives, the arena of the memory plan, the
//! shared workspace and a static copy of every named input (with exact memory, see
//! [`ExecOptions::exact_memory`], a block per intermediate and per workspace size instead);
//! binds every step to its tensors (arena views, static inputs, external tensors held by the
//! exec); runs the steps eagerly `warmups` times; then captures every capture-safe
//! segment through the HAL's stream capture — a recorded call list on the CPU, prepared
//! command buffers on wgpu, a CUDA graph on CUDA. A replay launches the captured segments and
//! runs the unsafe ones eagerly between them, in stream order on the calling thread's stream,
//! with the same kernels on the same addresses as an eager run: bitwise the same result.
//!
//! The addresses never change while the exec lives, so the exec outlives its graph and its
//! plan, and new inputs are copied in ([`GraphExec::set_input`]).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::capture::{CapturedExec, CapturedGraph};
use super::graph::{BufferRole, HostFn, NodeKind, Operand};
use super::named::Named;
use super::plan::CapturePlan;
use crate::error::{Error, Result};
use crate::hal::{Backend, CaptureMode, DevicePtr, StreamId};
use crate::ops::Plan;
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

/// How to instantiate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecOptions {
    /// Eager runs of the whole plan before capturing (default 1). They execute the graph:
    /// its writes to external state and its host functions happen.
    pub warmups: usize,
    /// Capture the capture-safe segments (default true); false runs every step eagerly on
    /// replay (the bound, pre-planned eager path).
    pub capture: bool,
    /// Give every intermediate a block of exactly its bytes, and every step a workspace of
    /// exactly its size, instead of packing the intermediates into one arena and sharing one
    /// workspace of the largest size: a kernel that writes past its tensor then leaves the
    /// allocation, where AddressSanitizer or compute-sanitizer sees it, instead of landing in
    /// the next intermediate. Costs the memory plan's saving. `None` (the default) follows
    /// the device allocator's exact mode (`UNIRT_ALLOC_EXACT`, see `crate::alloc`).
    pub exact_memory: Option<bool>,
}

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions {
            warmups: 1,
            capture: true,
            exact_memory: None,
        }
    }
}

enum Bound {
    Op {
        plan: Plan,
        ins: Vec<Tensor>,
        outs: Vec<Tensor>,
        /// Index into the exec's `workspaces`, when the operator takes one.
        workspace: Option<usize>,
    },
    Host {
        f: HostFn,
        tensors: Vec<Tensor>,
    },
}

enum SegmentExec {
    Captured(CapturedExec),
    Eager(std::ops::Range<usize>),
}

thread_local! {
    /// The execs whose turn the calling thread holds (host steps run while it is held).
    static HELD_TURNS: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Marks an exec's turn held by the calling thread until dropped (a panic included).
struct HeldTurn(usize);

impl HeldTurn {
    fn enter(exec: usize) -> HeldTurn {
        // From a thread-local destructor the list may be gone: the turn is then not noted,
        // and only a host step replaying its own exec there would wait for itself.
        let _ = HELD_TURNS.try_with(|h| h.borrow_mut().push(exec));
        HeldTurn(exec)
    }
}

impl Drop for HeldTurn {
    fn drop(&mut self) {
        let _ = HELD_TURNS.try_with(|h| {
            let mut h = h.borrow_mut();
            if let Some(i) = h.iter().rposition(|&e| e == self.0) {
                h.remove(i);
            }
        });
    }
}

/// A replayable instance of a [`CapturePlan`]; see the [module](self) docs.
pub struct GraphExec {
    rt: Arc<Runtime>,
    steps: Vec<Bound>,
    segments: Vec<SegmentExec>,
    inputs: Named<Tensor>,
    outputs: Named<Tensor>,
    /// One shared workspace of the largest size, or with exact memory one per distinct size.
    workspaces: Vec<Tensor>,
    /// The arena of the memory plan, or with exact memory one block per intermediate. With
    /// the workspaces and the static inputs: memory the exec holds while it lives.
    arena: Vec<Tensor>,
    /// Held while a replay or input copy is enqueued (see [`GraphExec::replay`]), so that
    /// two threads' enqueues do not interleave.
    turn: Mutex<()>,
}

fn alloc_in(rt: &Runtime, bytes: usize) -> Result<Tensor> {
    Tensor::empty(&[bytes.max(1)], DType::U8, rt.device())
}

impl GraphExec {
    /// Instantiates `plan` (see the [module](self) docs). Refused while the calling thread
    /// records an operator graph on the device.
    pub fn instantiate(plan: &CapturePlan, options: ExecOptions) -> Result<GraphExec> {
        let graph = &plan.graph;
        let device = graph.device();
        if super::record::is_recording(device) {
            return Err(Error::Capturing(
                "instantiating a graph while this thread records one".into(),
            ));
        }
        let rt = Runtime::get(device)?;
        let stream = rt.stream()?;
        let exact = options
            .exact_memory
            .unwrap_or_else(|| rt.allocator().exact());
        // The exec holds its arena, workspace and static inputs for its whole life, so no
        // other allocation can be handed their addresses while it lives. (It does not route
        // the device's allocations into a private pool meanwhile: that switch is device-wide
        // and exclusive, and two threads instantiating at once would refuse each other.)
        let memory = (|| -> Result<_> {
            let mut arena = Vec::new();
            // Buffer index → (index into `arena`, byte offset there) of every intermediate.
            let mut placed = HashMap::with_capacity(plan.memory.offsets.len());
            if exact {
                for &(b, _) in &plan.memory.offsets {
                    placed.insert(b, (arena.len(), 0));
                    arena.push(alloc_in(&rt, graph.buffers()[b].tensor.storage_bytes())?);
                }
            } else if plan.memory.arena_bytes > 0 {
                arena.push(alloc_in(&rt, plan.memory.arena_bytes)?);
                placed.extend(plan.memory.offsets.iter().map(|&(b, off)| (b, (0, off))));
            }
            // The workspace sizes: each one the steps take, or the largest alone (shared).
            let sizes = match (exact, plan.workspace_size()) {
                (true, _) => plan.workspace_sizes().to_vec(),
                (false, 0) => Vec::new(),
                (false, n) => vec![n],
            };
            let workspaces = sizes
                .iter()
                .map(|&n| alloc_in(&rt, n))
                .collect::<Result<Vec<_>>>()?;
            let mut statics = Vec::new();
            for (i, b) in graph.buffers().iter().enumerate() {
                if let BufferRole::Input(_) = b.role {
                    statics.push((i, alloc_in(&rt, b.tensor.storage_bytes())?));
                }
            }
            Ok((arena, placed, sizes, workspaces, statics))
        })();
        let (arena, placed, workspace_sizes, workspaces, statics) = memory?;
        // The static inputs start with the graph's values.
        for (i, s) in &statics {
            let src = &graph.buffers()[*i].tensor;
            let n = src.storage_bytes();
            if n > 0 {
                src.order_on(stream)?;
                rt.memcpy_d2d(
                    DevicePtr(s.base_addr()),
                    DevicePtr(src.base_addr()),
                    n,
                    true,
                )?;
            }
        }
        // Buffer index → index into `statics` (lookups stay constant-time in long graphs).
        let static_of: HashMap<usize, usize> = statics
            .iter()
            .enumerate()
            .map(|(k, (i, _))| (*i, k))
            .collect();
        let tensor = |o: &Operand| -> Result<Tensor> {
            let b = &graph.buffers()[o.buffer.0];
            match &b.role {
                BufferRole::Input(_) => match static_of.get(&o.buffer.0) {
                    Some(&k) => o.view_in(&statics[k].1, 0),
                    None => Err(Error::Internal("a static input is missing".into())),
                },
                BufferRole::External => o.view_in(&b.tensor, 0),
                BufferRole::Intermediate => match placed.get(&o.buffer.0) {
                    Some(&(block, off)) => o.view_in(&arena[block], off),
                    None => Err(Error::Internal(format!(
                        "intermediate buffer {} has no place in the arena",
                        o.buffer.0
                    ))),
                },
            }
        };
        let mut steps = Vec::with_capacity(plan.steps.len());
        for s in &plan.steps {
            let ins = s.inputs.iter().map(&tensor).collect::<Result<Vec<_>>>()?;
            let outs = s.outputs.iter().map(&tensor).collect::<Result<Vec<_>>>()?;
            steps.push(match &s.kind {
                NodeKind::Op(p) => Bound::Op {
                    plan: p.clone(),
                    ins,
                    outs,
                    // The smallest workspace that holds the step's (with one shared, that one).
                    workspace: match p.workspace_size() {
                        0 => None,
                        n => Some(workspace_sizes.partition_point(|&have| have < n)),
                    },
                },
                NodeKind::Host { f, .. } => Bound::Host {
                    f: f.clone(),
                    tensors: ins,
                },
            });
        }
        let inputs = graph
            .buffers()
            .iter()
            .zip(0..)
            .filter_map(|(b, i)| match &b.role {
                BufferRole::Input(name) => static_of.get(&i).map(|&k| {
                    let s = &statics[k].1;
                    s.view_storage(b.tensor.layout().clone(), b.tensor.dtype())
                        .map(|t| (name.clone(), t))
                }),
                _ => None,
            })
            .collect::<Result<Named<_>>>()?;
        let outputs = plan
            .outputs
            .iter()
            .map(|(n, o)| Ok((n.clone(), tensor(o)?)))
            .collect::<Result<Named<_>>>()?;
        let mut exec = GraphExec {
            rt: rt.clone(),
            steps,
            segments: Vec::new(),
            inputs,
            outputs,
            workspaces,
            arena,
            turn: Mutex::new(()),
        };
        for _ in 0..options.warmups {
            exec.run_steps(0..exec.steps.len(), stream)?;
        }
        for seg in &plan.segments {
            let captured = if seg.capture_safe && options.capture {
                Some(exec.capture(seg.steps.clone(), stream)?)
            } else {
                None
            };
            exec.segments.push(match captured {
                Some(c) => SegmentExec::Captured(c),
                None => SegmentExec::Eager(seg.steps.clone()),
            });
        }
        Ok(exec)
    }

    /// Captures `steps` on `stream` through the backend's stream capture. The steps allocate
    /// nothing (their memory is bound), so the capture needs no private pool — and does not
    /// take the runtime's one-recording-per-device slot, so threads instantiating execs at
    /// once do not refuse each other.
    fn capture(&self, steps: std::ops::Range<usize>, stream: StreamId) -> Result<CapturedExec> {
        let backend = self.rt.backend();
        // Order the operands before capturing: a wait on another stream's work taken inside
        // the capture would put a node on a short-lived event into the graph.
        for b in &self.steps[steps.clone()] {
            let tensors = match b {
                Bound::Op { ins, outs, .. } => ins.iter().chain(outs.iter()),
                Bound::Host { tensors, .. } => tensors.iter().chain([].iter()),
            };
            for t in tensors.chain(&self.workspaces) {
                t.order_on(stream)?;
            }
        }
        self.rt.begin_capture_on(stream, CaptureMode::ThreadLocal)?;
        let launched = self.run_steps(steps, stream);
        let id = self.rt.end_capture_on(stream);
        let graph = CapturedGraph::from_capture(backend.clone(), id?, None);
        launched?;
        graph.instantiate()
    }

    fn run_steps(&self, steps: std::ops::Range<usize>, stream: StreamId) -> Result<()> {
        for b in &self.steps[steps] {
            match b {
                Bound::Op {
                    plan,
                    ins,
                    outs,
                    workspace,
                } => {
                    let ins: Vec<&Tensor> = ins.iter().collect();
                    let outs: Vec<&Tensor> = outs.iter().collect();
                    let ws = workspace.and_then(|i| self.workspaces.get(i));
                    // Run, never recorded: a host step before may have started a recording.
                    super::record::suspended(|| plan.launch(&ins, &outs, ws, stream))?;
                }
                Bound::Host { f, tensors } => {
                    for t in tensors {
                        t.order_on(stream)?;
                    }
                    self.rt.backend().stream_synchronize(stream)?;
                    f(tensors)?;
                }
            }
        }
        Ok(())
    }

    /// Enqueues one replay on the calling thread's stream of the device (asynchronous: read
    /// the outputs, or synchronise, to wait). Host steps wait for the device work before
    /// them.
    ///
    /// Replays and input copies of one exec are ordered, as CUDA orders the launches of one
    /// graph exec: enqueued from another thread (another stream) than the last one, a replay
    /// first waits, on the device, for the work of that stream (the exec's memory is ordered
    /// like any tensor's, see `crate::tensor`), so two replays never share the arena at once.
    /// Reading an output while another thread's replay rewrites it is still a race: a thread
    /// that reads what its own replay wrote keeps other threads' replays out meanwhile.
    pub fn replay(&self) -> Result<()> {
        if super::record::is_recording(self.rt.device()) {
            return Err(Error::Capturing(
                "replaying a graph while this thread records one".into(),
            ));
        }
        self.in_order(|stream| {
            for seg in &self.segments {
                match seg {
                    SegmentExec::Captured(x) => x.launch(stream)?,
                    SegmentExec::Eager(r) => self.run_steps(r.clone(), stream)?,
                }
            }
            Ok(())
        })
    }

    /// Runs `enqueue` on the calling thread's stream after the work other streams queued on
    /// the exec's memory — its arena, workspace, static inputs and outputs, ordered as every
    /// tensor is (see `crate::tensor`; captured segments launch without per-operand checks).
    /// One thread's replays cost a lock and an atomic load per buffer.
    fn in_order(&self, enqueue: impl FnOnce(StreamId) -> Result<()>) -> Result<()> {
        let stream = self.rt.stream()?;
        // A host step of this exec's replay that replays or feeds the exec again would wait
        // for the turn its own thread holds.
        let me = self as *const GraphExec as usize;
        if HELD_TURNS
            .try_with(|h| h.borrow().contains(&me))
            .unwrap_or(false)
        {
            return Err(Error::WaitsForItself(
                "a graph exec replayed or fed from one of its own host steps".into(),
            ));
        }
        let _turn = self.turn.lock();
        let _held = HeldTurn::enter(me);
        let statics = self.inputs.list().iter().chain(self.outputs.list());
        let statics = statics.map(|(_, t)| t);
        for t in self.arena.iter().chain(&self.workspaces).chain(statics) {
            t.order_on(stream)?;
        }
        enqueue(stream)
    }

    /// Copies `t` into static input `name` (in stream order, before the next replay; ordered
    /// with the exec's replays as [`replay`](Self::replay) says). `t` may have any layout and
    /// live on any device (another device's tensor is transferred first).
    pub fn set_input(&self, name: &str, t: &Tensor) -> Result<()> {
        let dst = self.input(name)?;
        if t.dtype() != dst.dtype() {
            return Err(Error::DTypeMismatch {
                op: format!("set_input {name:?}"),
                expected: dst.dtype(),
                got: t.dtype(),
            });
        }
        if t.shape() != dst.shape() {
            return Err(Error::ShapeMismatch {
                op: format!("set_input {name:?}"),
                expected: dst.shape().to_vec(),
                got: t.shape().to_vec(),
            });
        }
        if super::record::is_recording(self.rt.device()) {
            return Err(Error::Capturing(
                "feeding a graph exec while this thread records a graph".into(),
            ));
        }
        // The static input itself: nothing to copy.
        if t.shares_storage(dst) && t.layout() == dst.layout() {
            return Ok(());
        }
        // A tensor of another device (host data for a GPU exec, say) comes over first.
        let moved;
        let t = if t.device() == dst.device() {
            t
        } else {
            moved = t.to(dst.device())?;
            &moved
        };
        let copy = crate::ops::rearrange::copy_into(&t.desc(), &dst.desc())?;
        self.in_order(|stream| copy.launch(&[t], &[dst], None, stream))
    }

    /// The static tensor of input `name` (its address never changes while the exec lives).
    pub fn input(&self, name: &str) -> Result<&Tensor> {
        self.inputs
            .get(name)
            .ok_or_else(|| Error::BadParam(format!("the graph has no input {name:?}")))
    }

    /// The static tensor of output `name`, which every replay rewrites.
    pub fn output(&self, name: &str) -> Result<&Tensor> {
        self.outputs
            .get(name)
            .ok_or_else(|| Error::BadParam(format!("the graph has no output {name:?}")))
    }

    /// The names of the inputs and of the outputs.
    pub fn names(&self) -> (Vec<&str>, Vec<&str>) {
        (
            self.inputs.list().iter().map(|(n, _)| n.as_str()).collect(),
            self.outputs
                .list()
                .iter()
                .map(|(n, _)| n.as_str())
                .collect(),
        )
    }

    /// How many segments replay as captured graphs, and how many run eagerly.
    pub fn segment_counts(&self) -> (usize, usize) {
        let captured = self
            .segments
            .iter()
            .filter(|s| matches!(s, SegmentExec::Captured(_)))
            .count();
        (captured, self.segments.len() - captured)
    }

    /// Bytes holding the intermediates: the memory plan's arena, or with exact memory the
    /// sum of the intermediates' own blocks.
    pub fn arena_bytes(&self) -> usize {
        self.arena.iter().map(Tensor::storage_bytes).sum()
    }

    /// Bytes of the workspaces: the one shared by every step, or with exact memory one per
    /// distinct size the steps take.
    pub fn workspace_bytes(&self) -> usize {
        self.workspaces.iter().map(Tensor::storage_bytes).sum()
    }

    /// Waits for the replays queued on the calling thread's stream.
    pub fn synchronize(&self) -> Result<()> {
        self.rt.sync_stream()
    }
}

impl Drop for GraphExec {
    /// Waits for the device before the exec's memory goes back to the allocator: a replay
    /// queued on another thread's stream may still use it.
    fn drop(&mut self) {
        let _ = self.rt.sync_device();
    }
}

impl std::fmt::Debug for GraphExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (c, e) = self.segment_counts();
        write!(
            f,
            "GraphExec({}, {} steps, {c} captured / {e} eager segments)",
            self.rt.device(),
            self.steps.len()
        )
    }
}
