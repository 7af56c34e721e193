//! The HAL's fixed kernels of [`crate::kernel::KERNELS`] in WGSL (`fixed.wgsl`, one section
//! per kernel), plus the two built-in kernels behind byte-granular memset and memcpy
//! (`builtin/`), compiled once per device.
//!
//! Every kernel takes its buffers as read_write storage bindings of group 0 (so an argument
//! bound twice, as in an in-place add, is one compatible usage) and its scalars as 16 bytes of
//! immediates. Buffer arguments are interior pointers: the binding covers the whole buffer when
//! it fits the storage-binding limit (which makes the bind group the same for every launch on
//! that buffer, so the cache hits), else a window starting at the offset aligned down to
//! `min_storage_buffer_offset_alignment`; the element offset inside the binding goes in the
//! immediates. Bind groups are cached by (layout, buffers, windows).
//!
//! `add_f32` has a third form for the common launch whose buffers all bind exactly at their
//! pointers: `out` bound to exactly its elements, the count read as that binding's length,
//! and no immediates at all (the `*Sized` kernels, through pipeline layouts without an
//! immediate range) — the shape a plain wgpu program has, and cheaper per dispatch on drivers
//! that copy immediates into every dispatch (see `fixed.wgsl`).

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::OnceLock;

use parking_lot::Mutex;

use super::super::memory::{ceil4, wgpu_error, DevBuf};
use crate::error::{Error, Result};

/// Work items per workgroup, as in every WGSL kernel here.
pub(crate) const WORKGROUP: u32 = 256;
/// Bytes of immediates every kernel takes.
pub(crate) const IMMEDIATE_BYTES: u32 = 16;

/// The elementwise op family: one `// ==== kernel: NAME ====` section per kernel.
const ELEMENTWISE: &str = include_str!("fixed.wgsl");

/// The section of an op-family file that holds kernel `name`: from its marker line to the next
/// marker (or the end). Empty when the file has no such section, which the shader compiler
/// then reports (no entry point) as a `KernelCompile` error.
fn section(family: &'static str, name: &str) -> &'static str {
    let marker = format!("// ==== kernel: {name} ====");
    let Some(start) = family.find(&marker) else {
        return "";
    };
    let body = &family[start + marker.len()..];
    let end = body.find("// ==== kernel: ").unwrap_or(body.len());
    &body[..end]
}

/// A compiled kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Which {
    Fill,
    /// `add_f32` where `out` may alias `a` or `b`: every binding read_write.
    AddF32,
    /// `add_f32` where `out` is a buffer of its own: `a` and `b` bound read-only, which lets
    /// the shader compiler assume no aliasing.
    AddF32NoAlias,
    Memset,
    CopyBytes,
    /// `AddF32` without immediates: every buffer bound at its pointer, `out` to exactly its
    /// n elements (n is that binding's length).
    AddF32Sized,
    /// `AddF32NoAlias` without immediates, bound as `AddF32Sized`.
    AddF32NoAliasSized,
}

/// Bind group layouts: the access of each binding.
const LAYOUTS: [&[bool]; 4] = [
    // read_only per binding
    &[false],
    &[false, true],
    &[false, false, false],
    &[true, true, false],
];

impl Which {
    /// The WGSL of the kernel. `direct`: every buffer argument is bound exactly at its
    /// pointer, so the element offsets are dropped from the indexing — which matters: with
    /// an offset from the immediates, LLVM-based drivers (lavapipe, llvmpipe) cannot prove the
    /// bounds-checked accesses contiguous and fall back to gathers (about 20 % slower).
    fn source(self, direct: bool) -> std::borrow::Cow<'static, str> {
        let text = self.source_with_offsets();
        if !direct {
            return text;
        }
        let mut t = text.into_owned();
        for off in ["p.off + ", "p.a_off + ", "p.b_off + ", "p.out_off + "] {
            t = t.replace(off, "");
        }
        t.into()
    }

    fn source_with_offsets(self) -> std::borrow::Cow<'static, str> {
        match self {
            Which::Fill => section(ELEMENTWISE, "fill").into(),
            Which::AddF32 => section(ELEMENTWISE, "add_f32").into(),
            Which::AddF32NoAlias => read_only_inputs(section(ELEMENTWISE, "add_f32")).into(),
            Which::AddF32Sized => section(ELEMENTWISE, "add_f32_sized").into(),
            Which::AddF32NoAliasSized => {
                read_only_inputs(section(ELEMENTWISE, "add_f32_sized")).into()
            }
            Which::Memset => include_str!("../builtin/memset.wgsl").into(),
            Which::CopyBytes => include_str!("../builtin/copy_bytes.wgsl").into(),
        }
    }

    /// Index into [`LAYOUTS`].
    fn layout(self) -> usize {
        match self {
            Which::Fill | Which::Memset => 0,
            Which::CopyBytes => 1,
            Which::AddF32 | Which::AddF32Sized => 2,
            Which::AddF32NoAlias | Which::AddF32NoAliasSized => 3,
        }
    }

    /// Whether the kernel takes immediates (all but the `*Sized` ones).
    fn immediates(self) -> bool {
        !matches!(self, Which::AddF32Sized | Which::AddF32NoAliasSized)
    }

    /// The kernel without immediates that does this one's work when every buffer binds at its
    /// pointer and `out` binds to exactly its elements, if there is one.
    pub fn sized(self) -> Option<Which> {
        match self {
            Which::AddF32 => Some(Which::AddF32Sized),
            Which::AddF32NoAlias => Some(Which::AddF32NoAliasSized),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Which::Fill => "fill",
            Which::AddF32
            | Which::AddF32NoAlias
            | Which::AddF32Sized
            | Which::AddF32NoAliasSized => "add_f32",
            Which::Memset => "unirt_memset",
            Which::CopyBytes => "unirt_copy_bytes",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// The kernel behind a public kernel name.
    pub fn public(name: &str) -> Result<Which> {
        match name {
            "fill" => Ok(Which::Fill),
            "add_f32" => Ok(Which::AddF32),
            _ => Err(Error::BadParam(format!(
                "the wgpu backend has no kernel {name:?}"
            ))),
        }
    }
}

/// `add_f32`'s WGSL with `a` and `b` bound read-only (`out` is a buffer of its own).
fn read_only_inputs(text: &str) -> String {
    text.replace("var<storage, read_write> a:", "var<storage, read> a:")
        .replace("var<storage, read_write> b:", "var<storage, read> b:")
}

/// One buffer binding: the buffer, and the window of it that is bound.
#[derive(Clone, Copy)]
pub(crate) struct Window<'a> {
    pub buf: &'a DevBuf,
    pub offset: u64,
    pub size: u64,
}

type BindKey = (Which, [(u64, u64, u64); 3]);

/// Pipelines and bind groups of one device.
pub(crate) struct Kernels {
    layouts: Vec<wgpu::BindGroupLayout>,
    /// Per bind group layout: the pipeline layout with the kernels' immediates, and one
    /// without (the `*Sized` kernels').
    pipe_layouts: Vec<[wgpu::PipelineLayout; 2]>,
    pipelines: [OnceLock<Result<wgpu::ComputePipeline>>; 14],
    groups: Mutex<HashMap<BindKey, wgpu::BindGroup>>,
    /// Why kernels cannot run here (no immediates), if so.
    unavailable: Option<String>,
    pub max_binding: u64,
    pub binding_align: u64,
    pub max_groups: u32,
    /// The operator kernels' pipelines and bind groups.
    pub ops: super::op::OpCache,
}

/// Bind groups kept before the cache is emptied (each holds its buffers alive).
const MAX_CACHED_GROUPS: usize = 4096;

impl Kernels {
    pub fn new(device: &wgpu::Device) -> Self {
        let limits = device.limits();
        let unavailable = if !device.features().contains(wgpu::Features::IMMEDIATES) {
            Some("the adapter lacks the IMMEDIATES feature that unirt's WGSL kernels use".into())
        } else if limits.max_immediate_size < IMMEDIATE_BYTES {
            Some(format!(
                "the adapter allows {} bytes of immediates, unirt's kernels need {IMMEDIATE_BYTES}",
                limits.max_immediate_size
            ))
        } else {
            None
        };
        let mut layouts = Vec::new();
        let mut pipe_layouts = Vec::new();
        for access in LAYOUTS {
            let entries: Vec<wgpu::BindGroupLayoutEntry> = access
                .iter()
                .enumerate()
                .map(|(binding, &read_only)| wgpu::BindGroupLayoutEntry {
                    binding: binding as u32,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage { read_only },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                })
                .collect();
            let bgl = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some("unirt"),
                entries: &entries,
            });
            let pl = |immediate_size| {
                device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                    label: Some("unirt"),
                    bind_group_layouts: &[Some(&bgl)],
                    immediate_size,
                })
            };
            let with = if unavailable.is_none() {
                IMMEDIATE_BYTES
            } else {
                0
            };
            pipe_layouts.push([pl(with), pl(0)]);
            layouts.push(bgl);
        }
        let align = u64::from(limits.min_storage_buffer_offset_alignment.max(4));
        Kernels {
            layouts,
            pipe_layouts,
            pipelines: Default::default(),
            groups: Mutex::new(HashMap::new()),
            unavailable,
            max_binding: (limits.max_storage_buffer_binding_size).min(1 << 31) & !3,
            binding_align: align,
            max_groups: limits.max_compute_workgroups_per_dimension.max(1),
            ops: Default::default(),
        }
    }

    /// The pipeline of a kernel, compiled on first use.
    pub fn pipeline(&self, device: &wgpu::Device, which: Which) -> Result<wgpu::ComputePipeline> {
        self.pipeline_variant(device, which, false)
    }

    /// The pipeline of a kernel; `direct` as in [`Which::source`].
    pub fn pipeline_variant(
        &self,
        device: &wgpu::Device,
        which: Which,
        direct: bool,
    ) -> Result<wgpu::ComputePipeline> {
        if let Some(why) = &self.unavailable {
            return Err(Error::unsupported(
                format!("kernel {} ({why})", which.name()),
                crate::device::DeviceKind::Wgpu,
            ));
        }
        let slot = &self.pipelines[which.index() * 2 + usize::from(direct)];
        if let Some(p) = slot.get() {
            return p.clone();
        }
        // Compiling (naga's parser recurses deeply) on a thread with room on its stack where
        // the caller's has little; a thread that cannot start is not remembered as a failure.
        crate::host_threads::on_roomy_stack(|| {
            slot.get_or_init(|| self.compile(device, which, direct))
                .clone()
        })
        .unwrap_or_else(|| {
            Err(Error::Internal(format!(
                "kernel {}: cannot start a thread with room on its stack to compile it",
                which.name()
            )))
        })
    }

    fn compile(
        &self,
        device: &wgpu::Device,
        which: Which,
        direct: bool,
    ) -> Result<wgpu::ComputePipeline> {
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(which.name()),
            source: wgpu::ShaderSource::Wgsl(which.source(direct)),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(which.name()),
            layout: Some(&self.pipe_layouts[which.layout()][usize::from(!which.immediates())]),
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        match pollster::block_on(scope.pop()) {
            None => Ok(pipeline),
            Some(e) => Err(Error::KernelCompile {
                kernel: which.name().into(),
                log: e.to_string(),
            }),
        }
    }

    /// The window to bind for `len` bytes at byte `off` of `buf` (padded size `buf_size`), and
    /// the byte offset of `off` inside it.
    pub fn window<'a>(&self, buf: &'a DevBuf, off: u64, len: u64) -> Result<(Window<'a>, u64)> {
        let size = buf.buffer.size();
        if size <= self.max_binding {
            let w = Window {
                buf,
                offset: 0,
                size,
            };
            return Ok((w, off));
        }
        let start = off - off % self.binding_align;
        let end = ceil4(off + len).min(size);
        if end - start > self.max_binding {
            return Err(Error::TooLarge {
                device: "wgpu".into(),
                requested: len,
                limit: self.max_binding.saturating_sub(self.binding_align),
            });
        }
        let w = Window {
            buf,
            offset: start,
            size: end - start,
        };
        Ok((w, off - start))
    }

    /// A window starting exactly at byte `off` (so the kernel needs no offset), when the
    /// offset meets the binding alignment and the range fits one binding.
    pub fn direct_window<'a>(&self, buf: &'a DevBuf, off: u64, len: u64) -> Option<Window<'a>> {
        let size = buf.buffer.size();
        // The alignment is a power of two (a WebGPU rule for this limit).
        if off & (self.binding_align - 1) != 0 || off >= size {
            return None;
        }
        let span = (size - off).min(self.max_binding) & !3;
        (span >= ceil4(len) && span > 0).then_some(Window {
            buf,
            offset: off,
            size: span,
        })
    }

    /// The bind group for these windows (cached).
    pub fn bind_group(
        &self,
        device: &wgpu::Device,
        which: Which,
        windows: &[Window],
    ) -> Result<wgpu::BindGroup> {
        let mut key: BindKey = (which, [(0, 0, 0); 3]);
        for (k, w) in key.1.iter_mut().zip(windows) {
            *k = (w.buf.id, w.offset, w.size);
        }
        if let Some(g) = self.groups.lock().get(&key) {
            return Ok(g.clone());
        }
        let mut entries = Vec::with_capacity(windows.len());
        for (i, w) in windows.iter().enumerate() {
            let size = NonZeroU64::new(w.size)
                .ok_or_else(|| Error::Internal("empty kernel binding".into()))?;
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &w.buf.buffer,
                    offset: w.offset,
                    size: Some(size),
                }),
            });
        }
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("unirt"),
            layout: &self.layouts[which.layout()],
            entries: &entries,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(wgpu_error("create_bind_group", e));
        }
        if windows.iter().any(|w| w.buf.temp) {
            return Ok(group);
        }
        let mut groups = self.groups.lock();
        if groups.len() >= MAX_CACHED_GROUPS {
            groups.clear();
        }
        groups.insert(key, group.clone());
        Ok(group)
    }

    /// Drops the cached bind groups that use buffer `id` (it is being freed).
    pub fn forget_buffer(&self, id: u64) {
        self.ops.forget_buffer(id);
        self.groups
            .lock()
            .retain(|k, _| !k.1.iter().any(|(b, _, _)| *b == id));
    }

    /// The (x, y) workgroup grid for `items` work items: rows of at most the per-dimension
    /// limit (the kernels index `gid.x + gid.y * nwg.x * 256`).
    pub fn groups_for(&self, items: u64) -> [u32; 3] {
        let g = items.div_ceil(u64::from(WORKGROUP)).max(1);
        let x = g.min(u64::from(self.max_groups));
        let y = g.div_ceil(x).min(u64::from(self.max_groups));
        [x as u32, y as u32, 1]
    }
}

#[cfg(test)]
mod section_tests {
    use super::*;

    #[test]
    fn each_kernel_is_its_own_section_of_the_family_file() {
        let fill = section(ELEMENTWISE, "fill");
        let add = section(ELEMENTWISE, "add_f32");
        assert!(fill.contains("fn main") && fill.contains("dst[p.off + i] = p.value"));
        assert!(
            !fill.contains("a_off"),
            "fill's section runs into add_f32's"
        );
        assert!(add.contains("fn main") && add.contains("a[p.a_off + i] + b[p.b_off + i]"));
        assert!(
            !add.contains("p.value"),
            "add_f32's section holds fill's code"
        );
        let sized = section(ELEMENTWISE, "add_f32_sized");
        assert!(sized.contains("fn main") && sized.contains("i < arrayLength(&out)"));
        assert!(
            !sized.contains("var<immediate>") && !add.contains("arrayLength"),
            "add_f32_sized takes immediates, or add_f32's section runs into it"
        );
        assert_eq!(section(ELEMENTWISE, "no_such_kernel"), "");
    }
}
