//! wgpu discovery: which adapters this machine has, in a stable order, described as unirt
//! devices.
//!
//! The instance and the adapters are enumerated once per process and kept, so opening a
//! device uses the very adapter that discovery described. `UNIRT_WGPU_BACKENDS=vulkan,gl`
//! restricts the wgpu backends; adapters without compute shaders are left out (unirt needs
//! them for every kernel and for unaligned copies).
//!
//! Each adapter is test-opened once (its wgpu device requested, as opening it would): one whose
//! `request_device` fails is listed as unusable with the driver's reason and its name, and is
//! not numbered, so `wgpu:N` always names an adapter that opened. The device and queue the
//! test-open created are kept for the first open of that device, so discovery requests no
//! device twice. `UNIRT_WGPU_FAIL_OPEN=gl` (a comma-separated list: a backend name matches
//! that backend's adapters, anything else a case-insensitive part of an adapter's name) makes
//! the test-open of the matching adapters fail, as fault injection.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::fork::PerProcess;

use crate::device::{Capabilities, DeviceClass, DeviceInfo, EventTiming, UnusableDevice};
use crate::error::{Error, Result};
use crate::hal::Probe;

/// One usable adapter and what discovery reported for it.
pub(crate) struct Found {
    pub adapter: wgpu::Adapter,
    pub info: DeviceInfo,
    /// The device and queue discovery's test-open created, until the first open takes them.
    opened: Mutex<Option<(wgpu::Device, wgpu::Queue)>>,
}

impl Found {
    /// The test-opened device and queue, for the first open only (later opens request their
    /// own).
    pub fn take_opened(&self) -> Option<(wgpu::Device, wgpu::Queue)> {
        self.opened.lock().take()
    }
}

/// The result of the one enumeration of this process.
enum Enumerated {
    Adapters {
        usable: Vec<Found>,
        /// GL adapters the parent listed, which this forked child cannot use: listed after
        /// the usable ones (where GL adapters always sort), so the indices stay the parent's.
        forked_gl: Vec<DeviceInfo>,
        /// Adapters whose test-open failed: listed, not numbered.
        unusable: Vec<UnusableDevice>,
    },
    None(String),
}

/// The fork generation + 1 of the process that started the GL backend (0: none did).
static GL_STARTED: AtomicU64 = AtomicU64::new(0);

/// Why a forked child leaves GL out.
const FORKED_GL: &str = "the GL backend was started before this process was forked: Mesa's \
    EGL keeps one display per process, whose driver threads a forked child does not have, so \
    GL adapters cannot be used in a forked child (Vulkan adapters can; a child started with \
    exec can use GL)";

/// Enumerated again in a forked child: the parent's instance and adapters belong to driver
/// threads the child does not have.
fn enumerated() -> &'static Enumerated {
    static E: PerProcess<Enumerated> = PerProcess::new();
    E.get_or_init_after_fork(enumerate)
}

/// Discovery for the wgpu vendor.
pub(crate) fn probe() -> Probe {
    match enumerated() {
        Enumerated::Adapters {
            usable,
            forked_gl,
            unusable,
        } => Probe::Opened {
            devices: usable
                .iter()
                .map(|f| f.info.clone())
                .chain(forked_gl.iter().cloned())
                .collect(),
            unusable: unusable.clone(),
        },
        Enumerated::None(reason) => Probe::Unavailable(reason.clone()),
    }
}

/// The adapter discovery listed as `wgpu:index`.
pub(crate) fn adapter(index: usize) -> Result<&'static Found> {
    match enumerated() {
        Enumerated::Adapters {
            usable, forked_gl, ..
        } => {
            if let Some(found) = usable.get(index) {
                return Ok(found);
            }
            if index < usable.len() + forked_gl.len() {
                return Err(Error::Unavailable {
                    backend: crate::device::DeviceKind::Wgpu,
                    reason: format!("wgpu:{index}: {FORKED_GL}"),
                });
            }
            Err(Error::DeviceNotFound(format!(
                "wgpu:{index} (wgpu has {} device(s))",
                usable.len() + forked_gl.len()
            )))
        }
        Enumerated::None(reason) => Err(Error::Unavailable {
            backend: crate::device::DeviceKind::Wgpu,
            reason: reason.clone(),
        }),
    }
}

/// The backends `UNIRT_WGPU_BACKENDS` selects (all when unset). A value that is not UTF-8 is
/// read lossily, so it names an unknown backend instead of selecting all of them.
fn wanted_backends() -> std::result::Result<wgpu::Backends, String> {
    let Some(list) = std::env::var_os("UNIRT_WGPU_BACKENDS") else {
        return Ok(wgpu::Backends::all());
    };
    let list = list.to_string_lossy();
    if list.trim().is_empty() {
        return Ok(wgpu::Backends::all());
    }
    let mut b = wgpu::Backends::empty();
    for name in list.split(',').map(|s| s.trim().to_ascii_lowercase()) {
        b |= match name.as_str() {
            "vulkan" | "vk" => wgpu::Backends::VULKAN,
            "metal" | "mtl" => wgpu::Backends::METAL,
            "dx12" | "d3d12" => wgpu::Backends::DX12,
            "gl" | "gles" | "opengl" => wgpu::Backends::GL,
            "" => continue,
            other => {
                return Err(format!(
                    "UNIRT_WGPU_BACKENDS names an unknown backend {other:?} (use vulkan, metal, dx12, gl)"
                ))
            }
        };
    }
    Ok(b)
}

pub(crate) fn backend_name(b: wgpu::Backend) -> &'static str {
    match b {
        wgpu::Backend::Vulkan => "vulkan",
        wgpu::Backend::Metal => "metal",
        wgpu::Backend::Dx12 => "dx12",
        wgpu::Backend::Gl => "gl",
        wgpu::Backend::BrowserWebGpu => "webgpu",
        _ => "noop",
    }
}

fn backend_rank(b: wgpu::Backend) -> u8 {
    match b {
        wgpu::Backend::Vulkan => 0,
        wgpu::Backend::Metal => 1,
        wgpu::Backend::Dx12 => 2,
        wgpu::Backend::Gl => 3,
        _ => 4,
    }
}

fn type_name(t: wgpu::DeviceType) -> &'static str {
    match t {
        wgpu::DeviceType::DiscreteGpu => "discrete_gpu",
        wgpu::DeviceType::IntegratedGpu => "integrated_gpu",
        wgpu::DeviceType::VirtualGpu => "virtual_gpu",
        wgpu::DeviceType::Cpu => "cpu",
        wgpu::DeviceType::Other => "other",
    }
}

fn type_rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    }
}

fn vendor_name(id: u32) -> String {
    match id {
        0x10de => "NVIDIA".into(),
        0x1002 | 0x1022 => "AMD".into(),
        0x8086 => "Intel".into(),
        0x10005 => "Mesa".into(),
        0x106b => "Apple".into(),
        0x13b5 => "ARM".into(),
        0x5143 => "Qualcomm".into(),
        0x1414 => "Microsoft".into(),
        0 => "unknown".into(),
        other => format!("{other:#x}"),
    }
}

/// The features unirt asks for when the adapter has them (`SHADER_F16`: f16 tensors read and
/// written natively; `SUBGROUP`: workgroup reductions through subgroup operations; see
/// `kernels/wgsl.rs`. `UNIRT_WGPU_NO_F16=1` / `UNIRT_WGPU_NO_SUBGROUPS=1` leave them off).
///
/// `EXPERIMENTAL_COOPERATIVE_MATRIX` (matrix products on the adapter's matrix units,
/// `kernels/matmul_coop.rs`) only with `UNIRT_WGPU_COOP=1`: wgpu marks the feature
/// experimental, and enabling it moves every shader of the device to the Vulkan memory model,
/// so it stays opt-in until a GPU run has checked the whole suite with it.
pub(crate) fn wanted_features(adapter: &wgpu::Features) -> wgpu::Features {
    let mut want = wgpu::Features::TIMESTAMP_QUERY
        | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS
        | wgpu::Features::IMMEDIATES;
    if std::env::var_os("UNIRT_WGPU_NO_F16").is_none_or(|v| v != "1") {
        want |= wgpu::Features::SHADER_F16;
    }
    if std::env::var_os("UNIRT_WGPU_NO_SUBGROUPS").is_none_or(|v| v != "1") {
        want |= wgpu::Features::SUBGROUP;
    }
    if std::env::var_os("UNIRT_WGPU_COOP").is_some_and(|v| v == "1") {
        want |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
    }
    *adapter & want
}

/// Whether events can be stamped by the device (timestamps written inside encoders).
pub(crate) fn device_timing(features: &wgpu::Features) -> bool {
    features
        .contains(wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS)
}

/// The adapters `UNIRT_WGPU_FAIL_OPEN` names: a backend name (vulkan, metal, dx12, gl) matches
/// every adapter of that backend, anything else a case-insensitive part of the adapter's name.
fn injected_failure(info: &wgpu::AdapterInfo) -> Option<String> {
    let list = std::env::var("UNIRT_WGPU_FAIL_OPEN").ok()?;
    let name = info.name.to_lowercase();
    let backend = backend_name(info.backend);
    list.split(',')
        .map(|p| p.trim().to_lowercase())
        .filter(|p| !p.is_empty())
        .find(|p| p == backend || (!is_backend_name(p) && name.contains(p.as_str())))
        .map(|p| {
            format!("request_device: refused by fault injection (UNIRT_WGPU_FAIL_OPEN names {p:?})")
        })
}

fn is_backend_name(s: &str) -> bool {
    ["vulkan", "metal", "dx12", "gl"].contains(&s)
}

/// Test-opens an adapter as opening its device would: the device and queue, or the driver's
/// reason.
fn test_open(a: &wgpu::Adapter) -> std::result::Result<(wgpu::Device, wgpu::Queue), String> {
    if let Some(reason) = injected_failure(&a.get_info()) {
        return Err(reason);
    }
    super::gpu::request(a)
}

/// The listing of an adapter whose test-open failed.
fn unusable(a: &wgpu::Adapter, reason: String) -> UnusableDevice {
    let info = describe(0, a);
    UnusableDevice {
        name: info.name,
        vendor: info.vendor,
        driver: info.driver,
        api: info.api,
        reason,
    }
}

/// The adapter's cooperative-matrix configurations (M×N×K, operands → accumulator), and
/// whether unirt's GEMM may use them (`kernels/matmul_coop.rs`; opt-in, `wanted_features`).
fn matrix_units(a: &wgpu::Adapter, f: &wgpu::Features) -> String {
    let name = |t: wgpu::CooperativeScalarType| match t {
        wgpu::CooperativeScalarType::F32 => "f32",
        wgpu::CooperativeScalarType::F16 => "f16",
        wgpu::CooperativeScalarType::I32 => "i32",
        wgpu::CooperativeScalarType::U32 => "u32",
    };
    let configs: Vec<String> = a
        .cooperative_matrix_properties()
        .iter()
        .map(|c| {
            format!(
                "{}x{}x{} {}->{}",
                c.m_size,
                c.n_size,
                c.k_size,
                name(c.ab_type),
                name(c.cr_type)
            )
        })
        .collect();
    if configs.is_empty() {
        return "none".into();
    }
    let usable = if !f.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
        "wgpu does not enable them on this adapter"
    } else if wanted_features(f).contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
        "f16/f32 products use them (UNIRT_WGPU_COOP=1)"
    } else {
        "unused: UNIRT_WGPU_COOP=1 lets f16/f32 products use them"
    };
    format!("{} ({usable})", configs.join(", "))
}

fn describe(index: usize, a: &wgpu::Adapter) -> DeviceInfo {
    let i = a.get_info();
    let l = a.limits();
    let f = a.features();
    let timing = device_timing(&f);
    // Host memory (CPU and integrated adapters share it; wgpu reports no device memory size).
    let total = crate::meminfo::host_memory().map_or(l.max_buffer_size, |m| m.total);
    let mut details = vec![
        ("backend".to_string(), backend_name(i.backend).to_string()),
        ("device_type".into(), type_name(i.device_type).into()),
        ("vendor_id".into(), format!("{:#x}", i.vendor)),
        ("device_id".into(), format!("{:#x}", i.device)),
        ("driver_info".into(), i.driver_info.clone()),
        ("max_buffer_size".into(), l.max_buffer_size.to_string()),
        (
            "max_storage_buffer_binding_size".into(),
            l.max_storage_buffer_binding_size.to_string(),
        ),
        (
            "min_storage_buffer_offset_alignment".into(),
            l.min_storage_buffer_offset_alignment.to_string(),
        ),
        (
            "max_compute_workgroups_per_dimension".into(),
            l.max_compute_workgroups_per_dimension.to_string(),
        ),
        (
            "max_compute_invocations_per_workgroup".into(),
            l.max_compute_invocations_per_workgroup.to_string(),
        ),
        (
            "max_immediate_size".into(),
            l.max_immediate_size.to_string(),
        ),
        (
            "timestamp_query".into(),
            f.contains(wgpu::Features::TIMESTAMP_QUERY).to_string(),
        ),
        (
            "memory_total_source".into(),
            "host memory (wgpu reports no device memory size)".into(),
        ),
    ];
    if !i.device_pci_bus_id.is_empty() {
        details.push(("pci_bus_id".into(), i.device_pci_bus_id.clone()));
    }
    details.push(("matrix_units".into(), matrix_units(a, &f)));
    let driver = match (i.driver.is_empty(), i.driver_info.is_empty()) {
        (false, false) => format!("{} ({})", i.driver, i.driver_info),
        (false, true) => i.driver.clone(),
        (true, false) => i.driver_info.clone(),
        (true, true) => "unknown".into(),
    };
    DeviceInfo {
        index,
        name: i.name.clone(),
        vendor: vendor_name(i.vendor),
        driver,
        api: backend_name(i.backend).into(),
        class: match i.device_type {
            wgpu::DeviceType::DiscreteGpu => DeviceClass::DiscreteGpu,
            wgpu::DeviceType::IntegratedGpu => DeviceClass::IntegratedGpu,
            wgpu::DeviceType::VirtualGpu => DeviceClass::VirtualGpu,
            wgpu::DeviceType::Cpu => DeviceClass::Software,
            wgpu::DeviceType::Other => DeviceClass::Unknown,
        },
        memory_total: total,
        // Buffers are padded to whole words (see `memory`): an allocation of the adapter's
        // limit itself would pad past it when the limit is not a multiple of four (lavapipe's
        // is 2^31 - 1).
        max_allocation: super::memory::floor4(l.max_buffer_size),
        details,
        capabilities: Capabilities {
            async_streams: true,
            capture: true,
            stream_ordered_memory: true,
            pinned_host_memory: false,
            unified_addressing: false,
            event_timing: if timing {
                EventTiming::Device
            } else {
                EventTiming::Host
            },
        },
    }
}

/// Enumerates the adapters; `parent` is what the process this one was forked from found.
fn enumerate(parent: Option<&'static Enumerated>) -> Enumerated {
    let mut backends = match wanted_backends() {
        Ok(b) => b,
        Err(reason) => return Enumerated::None(reason),
    };
    let refused = super::loaders::secure(&mut backends);
    let generation = crate::fork::generation();
    let gl_started = GL_STARTED.load(Ordering::SeqCst);
    let mut forked_gl = Vec::new();
    let mut unusable_gl = Vec::new();
    if gl_started != 0 && gl_started != generation + 1 && backends.contains(wgpu::Backends::GL) {
        backends.remove(wgpu::Backends::GL);
        if let Some(Enumerated::Adapters {
            usable,
            forked_gl: older,
            unusable,
        }) = parent
        {
            unusable_gl = unusable
                .iter()
                .filter(|u| u.api == backend_name(wgpu::Backend::Gl))
                .cloned()
                .collect();
            forked_gl = usable
                .iter()
                .map(|f| &f.info)
                .chain(older.iter())
                .filter(|i| i.api == backend_name(wgpu::Backend::Gl))
                .cloned()
                .collect();
        }
    }
    // Only the wanted backends are initialised: a GL-less filter then never starts EGL.
    let wanted =
        backends & wgpu::InstanceDescriptor::new_without_display_handle_from_env().backends;
    if wanted.contains(wgpu::Backends::GL) {
        GL_STARTED.store(generation + 1, Ordering::SeqCst);
    }
    let all = super::instance::adapters(wanted);
    let seen = all.len();
    let mut skipped = Vec::new();
    let mut usable: Vec<wgpu::Adapter> = all
        .into_iter()
        .filter(|a| {
            let info = a.get_info();
            let compute = a
                .get_downlevel_capabilities()
                .flags
                .contains(wgpu::DownlevelFlags::COMPUTE_SHADERS);
            if info.backend == wgpu::Backend::Noop || info.backend == wgpu::Backend::BrowserWebGpu {
                false
            } else if !compute {
                skipped.push(format!(
                    "{} ({}) has no compute shaders",
                    info.name,
                    backend_name(info.backend)
                ));
                false
            } else {
                true
            }
        })
        .collect();
    // A stable order whatever order the loaders answer in: backend, device type, then name.
    usable.sort_by_cached_key(|a| {
        let i = a.get_info();
        (
            backend_rank(i.backend),
            type_rank(i.device_type),
            i.name.clone(),
            i.vendor,
            i.device,
            i.device_pci_bus_id.clone(),
        )
    });
    if usable.is_empty() && forked_gl.is_empty() {
        if let Some(refused) = refused {
            return Enumerated::None(refused);
        }
        let mut reason = format!("no wgpu adapter (enumerated {seen} with backends {backends:?}");
        if !skipped.is_empty() {
            reason.push_str(&format!("; skipped: {}", skipped.join(", ")));
        }
        reason.push_str("; install a Vulkan, Metal, DX12 or GL driver, e.g. Mesa's lavapipe)");
        return Enumerated::None(reason);
    }
    // Adapters that cannot be opened are not devices: the others are numbered densely.
    let mut found: Vec<Found> = Vec::with_capacity(usable.len());
    let mut failed = Vec::new();
    for adapter in usable {
        match test_open(&adapter) {
            Ok(pair) => found.push(Found {
                info: describe(found.len(), &adapter),
                adapter,
                opened: Mutex::new(Some(pair)),
            }),
            Err(reason) => failed.push(unusable(&adapter, reason)),
        }
    }
    let usable = found;
    // In a forked child GL is not enumerated again: the parent's unusable GL adapters stay listed.
    failed.extend(unusable_gl);
    for (i, info) in forked_gl.iter_mut().enumerate() {
        info.index = usable.len() + i;
        info.details
            .push(("unusable_here".into(), FORKED_GL.to_string()));
    }
    Enumerated::Adapters {
        usable,
        forked_gl,
        unusable: failed,
    }
}
