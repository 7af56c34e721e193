//! Captured graphs: native `CUgraph` / `CUgraphExec`, with the device ranges they touch.

use std::sync::Arc;

/// A captured graph. `raw` is the `CUgraph` and also the HAL handle.
#[derive(Debug)]
pub(super) struct CuGraph {
    pub raw: u64,
    pub ranges: Arc<[(u64, u64)]>,
}

/// An instantiated graph. `raw` is the `CUgraphExec` and also the HAL handle. `ranges` are
/// re-checked against the allocation table before every launch, so a replay never writes
/// memory freed since the capture (CUDA itself would not notice).
#[derive(Debug)]
pub(super) struct CuGraphExec {
    pub raw: u64,
    pub ranges: Arc<[(u64, u64)]>,
}
