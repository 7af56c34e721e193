//! Entry points for devices: init, counts, the current device, memory info, snapshots.

use std::ffi::{c_char, c_int};

use unirt::{Backend, Result};

use crate::boundary::{check_out, guard, last_error_into, write_out, Status};
use crate::current::{
    count, current_device, device, set_current, type_value, with_current, DEVICE_TYPE_COUNT,
};

/// `INFINIRT_RESOURCE_FIELD_MEMORY_CAPACITY`.
pub const RESOURCE_FIELD_MEMORY_CAPACITY: u64 = 1 << 0;

/// `infinirtDeviceResourceSnapshot_t`, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DeviceResourceSnapshot {
    pub device_type: c_int,
    pub device_id: c_int,
    pub valid_fields: u64,
    pub estimated_fields: u64,
    pub free_bytes: usize,
    pub total_bytes: usize,
    pub used_bytes: usize,
    pub reserved_bytes: usize,
    pub compute_utilization: f32,
    pub memory_bandwidth_utilization: f32,
    pub kernel_time_ratio: f32,
    pub communication_time_ratio: f32,
    pub communication_bytes: u64,
}

// The C test checks the same size with _Static_assert.
const _: () = assert!(std::mem::size_of::<DeviceResourceSnapshot>() == 80);

fn saturate(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// Probes every vendor (once per process). Calling it is optional: every entry point
/// discovers on first use.
#[no_mangle]
pub extern "C" fn infinirtInit() -> Status {
    guard(|| {
        unirt::discover();
        Ok(())
    })
}

/// Fills `count_array[0..INFINI_DEVICE_TYPE_COUNT]` with the device count of each upstream type.
///
/// # Safety
/// `count_array` must be NULL or writable for `INFINI_DEVICE_TYPE_COUNT` ints.
#[no_mangle]
pub unsafe extern "C" fn infinirtGetAllDeviceCount(count_array: *mut c_int) -> Status {
    guard(|| {
        check_out(count_array, "count_array")?;
        let counts = (0..DEVICE_TYPE_COUNT)
            .map(|t| count(t).map(|n| c_int::try_from(n).unwrap_or(c_int::MAX)))
            .collect::<Result<Vec<_>>>()?;
        for (i, n) in counts.into_iter().enumerate() {
            // SAFETY: i < INFINI_DEVICE_TYPE_COUNT, the array length the caller promises.
            unsafe { count_array.add(i).write(n) };
        }
        Ok(())
    })
}

/// The number of devices of one type (0 with SUCCESS for a vendor without devices).
///
/// # Safety
/// `count` must be NULL or valid for writing an int.
#[no_mangle]
pub unsafe extern "C" fn infinirtGetDeviceCount(
    device_type: c_int,
    count_out: *mut c_int,
) -> Status {
    guard(|| {
        check_out(count_out, "count")?;
        let n = count(device_type)?;
        // SAFETY: checked non-null; writable by the caller's contract.
        unsafe { write_out(count_out, c_int::try_from(n).unwrap_or(c_int::MAX), "count") }
    })
}

/// Makes `(device_type, device_id)` the calling thread's current device.
#[no_mangle]
pub extern "C" fn infinirtSetDevice(device_type: c_int, device_id: c_int) -> Status {
    guard(|| set_current(device(device_type, device_id)?))
}

/// The calling thread's current device; either pointer may be NULL, not both.
///
/// # Safety
/// Non-null pointers must be valid for writing.
#[no_mangle]
pub unsafe extern "C" fn infinirtGetDevice(
    device_ptr: *mut c_int,
    device_id_ptr: *mut c_int,
) -> Status {
    guard(|| {
        if device_ptr.is_null() && device_id_ptr.is_null() {
            return Err(unirt::Error::NullPointer(
                "both device_ptr and device_id_ptr are NULL".into(),
            ));
        }
        let d = current_device()?;
        if !device_ptr.is_null() {
            // SAFETY: non-null; writable by the caller's contract.
            unsafe { device_ptr.write(type_value(d.kind)) };
        }
        if !device_id_ptr.is_null() {
            // SAFETY: non-null; writable by the caller's contract.
            unsafe { device_id_ptr.write(c_int::try_from(d.index).unwrap_or(c_int::MAX)) };
        }
        Ok(())
    })
}

/// Free and total memory of a device (not necessarily the current one).
///
/// # Safety
/// Non-null pointers must be valid for writing a `size_t`.
#[no_mangle]
pub unsafe extern "C" fn infinirtGetMemInfo(
    device_type: c_int,
    device_id: c_int,
    free_bytes: *mut usize,
    total_bytes: *mut usize,
) -> Status {
    guard(|| {
        check_out(free_bytes, "free_bytes")?;
        check_out(total_bytes, "total_bytes")?;
        let m = unirt::open(device(device_type, device_id)?)?.mem_info()?;
        // SAFETY: both checked non-null; writable by the caller's contract.
        unsafe {
            free_bytes.write(saturate(m.free));
            total_bytes.write(saturate(m.total));
        }
        Ok(())
    })
}

/// A resource snapshot of a device: unirt fills the memory fields.
///
/// # Safety
/// A non-null `snapshot` must be valid for writing an `infinirtDeviceResourceSnapshot_t`.
#[no_mangle]
pub unsafe extern "C" fn infinirtGetDeviceResourceSnapshot(
    device_type: c_int,
    device_id: c_int,
    snapshot: *mut DeviceResourceSnapshot,
) -> Status {
    guard(|| {
        check_out(snapshot, "snapshot")?;
        let m = unirt::open(device(device_type, device_id)?)?.mem_info()?;
        let s = DeviceResourceSnapshot {
            device_type,
            device_id,
            valid_fields: RESOURCE_FIELD_MEMORY_CAPACITY,
            free_bytes: saturate(m.free),
            total_bytes: saturate(m.total),
            used_bytes: saturate(m.total.saturating_sub(m.free)),
            ..Default::default()
        };
        // SAFETY: checked non-null; writable by the caller's contract.
        unsafe { write_out(snapshot, s, "snapshot") }
    })
}

/// Waits for all work on every stream of the current device.
#[no_mangle]
pub extern "C" fn infinirtDeviceSynchronize() -> Status {
    guard(|| with_current(|c| c.backend.synchronize()))
}

/// unirt extension: copies the message of this thread's last failed call into `buf`
/// (NUL-terminated, truncated to `size` bytes). NULL `buf` is NULL_POINTER.
///
/// # Safety
/// A non-null `buf` must be writable for `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn unirtGetLastErrorMessage(buf: *mut c_char, size: usize) -> Status {
    // SAFETY: forwarded contract.
    guard(|| unsafe { last_error_into(buf, size) })
}
