//! The control interface tests reach through `dlsym` (all prefixed `unirt_fakecuda_`): set the
//! fault list, count calls, read the misuse log and the live-object counts.

use std::ffi::{c_char, c_int, CStr};
use std::sync::Mutex;

use crate::state::{lock, Handle};

static MISUSE: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Records a call a real driver might crash on (or that only this fake refuses).
pub fn misuse(what: String) {
    eprintln!("unirt-fakecuda: MISUSE: {what}");
    MISUSE.lock().unwrap_or_else(|e| e.into_inner()).push(what);
}

/// Replaces the fault list (see the `faults` module) and resets call counters; 0 on success,
/// -1 when `spec` does not parse (the list is then empty), -2 for a null or non-UTF-8 `spec`.
///
/// # Safety
/// `spec` must be null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn unirt_fakecuda_set_faults(spec: *const c_char) -> c_int {
    if spec.is_null() {
        return -2;
    }
    // SAFETY: non-null and NUL-terminated (the caller's contract).
    let Ok(s) = unsafe { CStr::from_ptr(spec) }.to_str() else {
        return -2;
    };
    match crate::faults::parse(s) {
        Ok(r) => {
            crate::faults::set(r);
            0
        }
        Err(e) => {
            eprintln!("unirt-fakecuda: fault list {s:?} rejected: {e}");
            crate::faults::set(Vec::new());
            -1
        }
    }
}

/// Calls of the function `name` since the fault list was last set.
///
/// # Safety
/// `name` must be null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn unirt_fakecuda_calls(name: *const c_char) -> u64 {
    if name.is_null() {
        return 0;
    }
    // SAFETY: non-null and NUL-terminated (the caller's contract).
    let n = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    crate::faults::calls(&n)
}

/// Faults injected since the fault list was last set.
#[no_mangle]
pub extern "C" fn unirt_fakecuda_fired() -> u64 {
    crate::faults::fired()
}

/// Contexts poisoned by injected sticky errors since the library loaded.
#[no_mangle]
pub extern "C" fn unirt_fakecuda_poisoned() -> u64 {
    crate::state::POISONED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Misuses recorded so far (calls a real driver may crash on).
#[no_mangle]
pub extern "C" fn unirt_fakecuda_misuses() -> u64 {
    MISUSE.lock().unwrap_or_else(|e| e.into_inner()).len() as u64
}

/// Copies the misuse log (one line each, NUL-terminated, truncated to `len`) into `buf`;
/// returns the full length in bytes without the NUL.
///
/// # Safety
/// `buf` must be null or valid for `len` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn unirt_fakecuda_misuse_log(buf: *mut c_char, len: usize) -> usize {
    let text = MISUSE.lock().unwrap_or_else(|e| e.into_inner()).join("\n");
    if !buf.is_null() && len > 0 {
        let n = text.len().min(len - 1);
        // SAFETY: `buf` is valid for `len` bytes (the caller's contract); n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf as *mut u8, n);
            *buf.add(n) = 0;
        }
    }
    text.len()
}

/// Live objects of one kind: 0 device allocations, 1 pinned host allocations, 2 streams,
/// 3 events, 4 graphs, 5 graph execs, 6 modules, 7 retained primary contexts (references),
/// 8 stream captures in progress, 9 device bytes allocated.
#[no_mangle]
pub extern "C" fn unirt_fakecuda_live(kind: c_int) -> u64 {
    let g = lock();
    let Some(d) = g.as_ref() else { return 0 };
    let count = |f: fn(&Handle) -> bool| d.handles.values().filter(|h| f(h)).count() as u64;
    match kind {
        0 => d.mem.len() as u64,
        1 => d.pinned.len() as u64,
        2 => count(|h| matches!(h, Handle::Stream(_))),
        3 => count(|h| matches!(h, Handle::Event(_))),
        4 => count(|h| matches!(h, Handle::Graph(_))),
        5 => count(|h| matches!(h, Handle::Exec(_))),
        6 => count(|h| matches!(h, Handle::Module(_))),
        7 => d.primary.iter().flatten().map(|(_, refs)| *refs).sum(),
        8 => d.captures.len() as u64,
        9 => d.used.iter().sum(),
        _ => 0,
    }
}

/// Destroys every context and everything in it, as process exit would: for tests that made a
/// context release fail on purpose and must not leave it to the next test.
#[no_mangle]
pub extern "C" fn unirt_fakecuda_reset() {
    let contexts: Vec<_> = {
        let mut g = lock();
        let Some(d) = g.as_mut() else { return };
        let mut out = Vec::new();
        for slot in d.primary.iter_mut() {
            if let Some((c, _)) = slot.take() {
                out.push(c);
            }
        }
        out
    };
    for c in contexts {
        let streams = lock()
            .as_ref()
            .map(|d| d.streams_of(c.handle))
            .unwrap_or_default();
        for s in streams {
            s.sync();
        }
        if let Some(d) = lock().as_mut() {
            d.destroy_ctx(&c);
            d.handles.remove(&c.handle);
        }
    }
}
