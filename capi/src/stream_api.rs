//! Entry points for streams and events. A NULL stream is the current device's default stream;
//! every other handle is validated by the current device's backend.

use std::ffi::{c_int, c_void};

use unirt::{Backend, EventFlags, EventId, EventStatus};

use crate::boundary::{check_out, guard, required, to_handle, write_out, Status};
use crate::current::with_current;

/// `infinirtStream_t`, `infinirtEvent_t`, … : `void *`.
pub type Handle = *mut c_void;

/// A new stream of the current device.
///
/// # Safety
/// A non-null `stream_ptr` must be valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn infinirtStreamCreate(stream_ptr: *mut Handle) -> Status {
    guard(|| {
        check_out(stream_ptr, "stream_ptr")?;
        with_current(|c| {
            let s = c.backend.stream_create()?;
            // SAFETY: checked non-null; writable by the caller's contract.
            unsafe { write_out(stream_ptr, to_handle(s.0), "stream_ptr") }
        })
    })
}

/// Destroys a stream (the default stream cannot be destroyed: BAD_PARAM).
#[no_mangle]
pub extern "C" fn infinirtStreamDestroy(stream: Handle) -> Status {
    guard(|| with_current(|c| c.backend.stream_destroy(c.stream(stream))))
}

/// Waits for all work enqueued on `stream`.
#[no_mangle]
pub extern "C" fn infinirtStreamSynchronize(stream: Handle) -> Status {
    guard(|| with_current(|c| c.backend.stream_synchronize(c.stream(stream))))
}

/// Makes later work on `stream` wait for the work `event` last recorded.
#[no_mangle]
pub extern "C" fn infinirtStreamWaitEvent(stream: Handle, event: Handle) -> Status {
    guard(|| {
        let e = EventId(required(event, "event")?);
        with_current(|c| c.backend.stream_wait_event(c.stream(stream), e))
    })
}

/// A new timing event of the current device.
///
/// # Safety
/// A non-null `event_ptr` must be valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn infinirtEventCreate(event_ptr: *mut Handle) -> Status {
    // SAFETY: forwarded contract.
    unsafe { infinirtEventCreateWithFlags(event_ptr, EventFlags::DEFAULT.0) }
}

/// A new event with `INFINIRT_EVENT_*` flags (unknown bits are BAD_PARAM).
///
/// # Safety
/// A non-null `event_ptr` must be valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn infinirtEventCreateWithFlags(
    event_ptr: *mut Handle,
    flags: u32,
) -> Status {
    guard(|| {
        check_out(event_ptr, "event_ptr")?;
        let flags = EventFlags::new(flags)?;
        with_current(|c| {
            let e = c.backend.event_create(flags)?;
            // SAFETY: checked non-null; writable by the caller's contract.
            unsafe { write_out(event_ptr, to_handle(e.0), "event_ptr") }
        })
    })
}

/// Records `event` on `stream`.
#[no_mangle]
pub extern "C" fn infinirtEventRecord(event: Handle, stream: Handle) -> Status {
    guard(|| {
        let e = EventId(required(event, "event")?);
        with_current(|c| c.backend.event_record(e, c.stream(stream)))
    })
}

/// Writes `INFINIRT_EVENT_COMPLETE` or `INFINIRT_EVENT_NOT_READY`.
///
/// # Safety
/// A non-null `status_ptr` must be valid for writing an int.
#[no_mangle]
pub unsafe extern "C" fn infinirtEventQuery(event: Handle, status_ptr: *mut c_int) -> Status {
    guard(|| {
        check_out(status_ptr, "status_ptr")?;
        let e = EventId(required(event, "event")?);
        let st = with_current(|c| c.backend.event_query(e))?;
        let v = match st {
            EventStatus::Complete => 0,
            EventStatus::NotReady => 1,
        };
        // SAFETY: checked non-null; writable by the caller's contract.
        unsafe { write_out(status_ptr, v, "status_ptr") }
    })
}

/// Blocks until the work `event` recorded has completed.
#[no_mangle]
pub extern "C" fn infinirtEventSynchronize(event: Handle) -> Status {
    guard(|| {
        let e = EventId(required(event, "event")?);
        with_current(|c| c.backend.event_synchronize(e))
    })
}

/// Destroys an event.
#[no_mangle]
pub extern "C" fn infinirtEventDestroy(event: Handle) -> Status {
    guard(|| {
        let e = EventId(required(event, "event")?);
        with_current(|c| c.backend.event_destroy(e))
    })
}

/// Milliseconds between two completed timing events.
///
/// # Safety
/// A non-null `ms_ptr` must be valid for writing a float.
#[no_mangle]
pub unsafe extern "C" fn infinirtEventElapsedTime(
    ms_ptr: *mut f32,
    start: Handle,
    end: Handle,
) -> Status {
    guard(|| {
        check_out(ms_ptr, "ms_ptr")?;
        let (a, b) = (
            EventId(required(start, "start")?),
            EventId(required(end, "end")?),
        );
        let ms = with_current(|c| c.backend.event_elapsed_ms(a, b))?;
        // SAFETY: checked non-null; writable by the caller's contract.
        unsafe { write_out(ms_ptr, ms, "ms_ptr") }
    })
}
