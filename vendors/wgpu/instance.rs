//! The wgpu instances unirt enumerates adapters from: compute only, no window system.
//!
//! wgpu enables every window-system extension the Vulkan loader offers (Wayland, XCB, Xlib)
//! because a wgpu program may present to a window. unirt never does, and enabling them has a
//! cost a library's users see: Mesa's device-select layer, given an instance with the Wayland
//! extension, connects to the compositor while it orders GPUs, and with no desktop session
//! libwayland prints "XDG_RUNTIME_DIR is invalid or not set in the environment" twice — on the
//! stderr of every program that merely asks libinfinirt for its devices. So the Vulkan
//! instance is made through wgpu-hal with those three extensions left out (`VK_KHR_surface`
//! stays: physical-device queries use it), then handed to wgpu; should that fail, wgpu's own
//! instance is used as before. The other backends (GL) come from wgpu's own instance.
//!
//! Setting `NODEVICE_SELECT` (the layer's switch), as the CLI does, is not an option for a
//! library: changing the environment races with the host program's threads.

use std::ffi::CStr;

/// The window-system instance extensions a compute-only Vulkan instance does without.
const WINDOW_SYSTEMS: [&CStr; 3] = [
    c"VK_KHR_wayland_surface",
    c"VK_KHR_xcb_surface",
    c"VK_KHR_xlib_surface",
];

/// Every adapter of `backends`.
pub(crate) fn adapters(backends: wgpu::Backends) -> Vec<wgpu::Adapter> {
    let mut found = Vec::new();
    let mut rest = backends;
    if backends.contains(wgpu::Backends::VULKAN) {
        if let Some(vk) = compute_only_vulkan() {
            found.extend(pollster::block_on(
                vk.enumerate_adapters(wgpu::Backends::VULKAN),
            ));
            rest.remove(wgpu::Backends::VULKAN);
        }
    }
    if !rest.is_empty() {
        // EGL is loaded and used from here on: see `exit.rs`.
        let gl = rest.contains(wgpu::Backends::GL);
        if gl {
            super::exit::gl_enumerating();
        }
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        desc.backends &= rest;
        let instance = wgpu::Instance::new(desc);
        found.extend(pollster::block_on(instance.enumerate_adapters(rest)));
    }
    // The drivers registered their exit handlers as they loaded.
    super::exit::driver_loaded();
    found
}

/// A wgpu instance over a Vulkan instance without window-system extensions; None when the
/// Vulkan loader or instance cannot be had (wgpu's own instance then reports why).
fn compute_only_vulkan() -> Option<wgpu::Instance> {
    let base = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    let desc = wgpu::hal::InstanceDescriptor {
        name: "unirt",
        flags: base.flags,
        memory_budget_thresholds: base.memory_budget_thresholds,
        backend_options: base.backend_options.clone(),
        telemetry: None,
        display: None,
    };
    let leave_out: Box<wgpu::hal::vulkan::CreateInstanceCallback> = Box::new(|args| {
        args.extensions.retain(|e| !WINDOW_SYSTEMS.contains(e));
    });
    // SAFETY: wgpu-hal's own Vulkan initialisation, with no display; the callback only leaves
    // out extensions for presenting to windows, which unirt never creates (no surface is ever
    // made from this instance, the only user of those extensions).
    let hal =
        unsafe { wgpu::hal::vulkan::Instance::init_with_callback(&desc, Some(leave_out)) }.ok()?;
    // SAFETY: `hal` is a valid Vulkan instance just made by wgpu-hal's Vulkan backend; wgpu
    // takes ownership of it.
    Some(unsafe { wgpu::Instance::from_hal::<wgpu::hal::api::Vulkan>(hal) })
}
