//! Graphs: record work once, replay it many times.
//!
//! What exists today is the bottom layer, **stream capture** ([`capture`]): a stream's async
//! work recorded by the backend (native CUDA graphs; a recorded command list on CPU; one
//! encoder and one submit on wgpu) into a [`Graph`], instantiated into a [`GraphExec`] and
//! launched on any stream of the device. [`Runtime::begin_capture`](crate::Runtime::begin_capture)
//! / [`end_capture`](crate::Runtime::end_capture) and the context's
//! `start_graph_recording` / `stop_graph_recording` make them; allocations made while
//! recording come from a graph-private pool that both handles keep reserved.
//!
//! The operator-graph layers that come next (issue 16) sit above the tensor and ops layers and
//! use capture as their replay engine on CUDA:
//!
//! ```text
//!  Graph        operators over tensors, built by recording (the eager Tensor API records
//!               instead of running) or by a builder; shapes and dtypes inferred at record time
//!      │  plan once per device
//!  CapturePlan  topological order; each op capture-safe or not (host reads, data-dependent
//!               shapes are not) and maximal safe segments; a liveness-based memory plan in one
//!               arena from a private pool; fused elementwise chains and GEMM epilogues;
//!               descriptors and workspaces made here, not at replay
//!      │  instantiate (warm-ups, then per backend)
//!  GraphExec    CUDA graphs per safe segment, prepared command buffers on wgpu, a prepared
//!               call list on the CPU; unsafe segments run eagerly between them; static
//!               input/output addresses; bitwise equal to eager execution
//! ```
//!
//! When those land, the capture handles here keep their job (a captured segment is a
//! [`GraphExec`]) under a more specific name, and the operator graph takes `Graph`.

pub mod capture;

pub use capture::{Graph, GraphExec};
