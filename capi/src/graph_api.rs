//! Entry points for stream capture and graph replay.

use std::ffi::{c_char, c_int};

use unirt::{Backend, CaptureMode, GraphExecId, GraphId};

use crate::boundary::{check_out, guard, required, to_handle, write_c_string, write_out, Status};
use crate::current::with_current;
use crate::stream_api::Handle;

/// Starts recording the async work of `stream` into a graph.
#[no_mangle]
pub extern "C" fn infinirtStreamBeginCapture(stream: Handle, mode: c_int) -> Status {
    guard(|| {
        let mode = CaptureMode::from_raw(mode)?;
        with_current(|c| c.backend.begin_capture(c.stream(stream), mode))
    })
}

/// Stops recording and returns the graph. A NULL `graph_ptr` is NULL_POINTER and leaves the
/// stream capturing.
///
/// # Safety
/// A non-null `graph_ptr` must be valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn infinirtStreamEndCapture(
    stream: Handle,
    graph_ptr: *mut Handle,
) -> Status {
    guard(|| {
        check_out(graph_ptr, "graph_ptr")?;
        with_current(|c| {
            let g = c.backend.end_capture(c.stream(stream))?;
            // SAFETY: checked non-null; writable by the caller's contract.
            unsafe { write_out(graph_ptr, to_handle(g.0), "graph_ptr") }
        })
    })
}

/// Destroys a graph; executables made from it stay valid.
#[no_mangle]
pub extern "C" fn infinirtGraphDestroy(graph: Handle) -> Status {
    guard(|| {
        let g = GraphId(required(graph, "graph")?);
        with_current(|c| c.backend.graph_destroy(g))
    })
}

/// Instantiates a graph. On failure the message goes to `log_buffer` (when non-NULL,
/// NUL-terminated, truncated to `buffer_size`); `*node_ptr`, when non-NULL, is set to NULL
/// (unirt does not name a failing node).
///
/// # Safety
/// Non-null `graph_exec_ptr` / `node_ptr` must be valid for writing a pointer; a non-null
/// `log_buffer` must be writable for `buffer_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn infinirtGraphInstantiate(
    graph_exec_ptr: *mut Handle,
    graph: Handle,
    node_ptr: *mut Handle,
    log_buffer: *mut c_char,
    buffer_size: usize,
) -> Status {
    guard(|| {
        // The header promises *node_ptr and the log on every failure, bad arguments included,
        // so they are written before anything can return early.
        if !node_ptr.is_null() {
            // SAFETY: non-null; writable by the caller's contract.
            unsafe { node_ptr.write(std::ptr::null_mut()) };
        }
        let result = check_out(graph_exec_ptr, "graph_exec_ptr")
            .and_then(|()| required(graph, "graph"))
            .and_then(|g| with_current(|c| c.backend.graph_instantiate(GraphId(g))));
        if !log_buffer.is_null() {
            let log = result
                .as_ref()
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            // SAFETY: writable for buffer_size bytes by the caller's contract.
            unsafe { write_c_string(log_buffer, buffer_size, &log) };
        }
        let x = result?;
        // SAFETY: checked non-null above; writable by the caller's contract.
        unsafe { write_out(graph_exec_ptr, to_handle(x.0), "graph_exec_ptr") }
    })
}

/// Destroys an executable graph; a pending launch still completes.
#[no_mangle]
pub extern "C" fn infinirtGraphExecDestroy(graph_exec: Handle) -> Status {
    guard(|| {
        let x = GraphExecId(required(graph_exec, "graph_exec")?);
        with_current(|c| c.backend.graph_exec_destroy(x))
    })
}

/// Enqueues one replay of `graph_exec` on `stream` — upstream's spelling (sic).
#[no_mangle]
pub extern "C" fn infinirtGraphLuanch(graph_exec: Handle, stream: Handle) -> Status {
    guard(|| {
        let x = GraphExecId(required(graph_exec, "graph_exec")?);
        with_current(|c| c.backend.graph_launch(x, c.stream(stream)))
    })
}

/// unirt extension: the correctly spelled [`infinirtGraphLuanch`].
#[no_mangle]
pub extern "C" fn infinirtGraphLaunch(graph_exec: Handle, stream: Handle) -> Status {
    infinirtGraphLuanch(graph_exec, stream)
}
