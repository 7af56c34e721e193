//! Graphs: record operators once, plan once, replay many times — on every backend.
//!
//! ```text
//!  Graph        operators over tensors (graph.rs), built by recording — the eager Tensor API
//!               records instead of running (record.rs; the context's and Runtime's
//!               start/stop_graph_recording, InfiniCore's names) — or by a GraphBuilder; shapes and
//!               dtypes inferred at record time (each operator's Plan); Runtime::run executes
//!               it eagerly through the KernelRegistry
//!      │  plan once for the device
//!  CapturePlan  topological order; capture-safe steps (host functions — reads back to the
//!               host, data-dependent decisions — are not) split into maximal segments;
//!               matmul epilogues (bias, activation, residual) and elementwise chains fused
//!               into one kernel each (fusion.rs); a liveness-based memory plan in one
//!               arena (memory.rs); descriptors and workspace made here (plan.rs)
//!      │  instantiate (exec.rs)
//!  GraphExec    warm-ups, then per capture-safe segment a captured stream graph (a prepared
//!               call list on the CPU, prepared command buffers on wgpu, a CUDA graph), the
//!               unsafe segments run eagerly between them; static input/output addresses (memory
//!               the exec holds while it lives); bitwise equal to eager execution
//! ```
//!
//! The bottom layer is **stream capture** ([`capture`]): a stream's async work recorded by
//! the backend into a [`CapturedGraph`], instantiated into a [`CapturedExec`] and launched on
//! any stream of the device ([`Runtime::begin_capture`](crate::Runtime::begin_capture) /
//! [`end_capture`](crate::Runtime::end_capture)). Allocations made while capturing come from a graph-private pool
//! that both handles keep reserved. A [`GraphExec`] replays its safe segments through it.
//!
//! See [`Graph`] for an example.

pub mod capture;
pub mod exec;
pub mod fusion;
#[allow(clippy::module_inception)]
pub mod graph;
pub mod memory;
mod named;
pub mod plan;
pub mod record;

pub use capture::{CapturedExec, CapturedGraph};
pub use exec::{ExecOptions, GraphExec};
pub use graph::{
    Buffer, BufferId, BufferRole, Graph, GraphBuilder, HostFn, Node, NodeKind, Operand,
};
pub use memory::MemoryPlan;
pub use plan::{CapturePlan, PlanOptions, Segment, Step};
pub use record::{host_op, record, start_recording, stop_recording};
