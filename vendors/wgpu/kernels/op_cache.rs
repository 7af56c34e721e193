//! Each device's cache of operator pipelines, bind group layouts, bind groups and constants
//! buffers, shared by every plan on that device (see `op.rs` for how a plan uses them).
//!
//! Plans with the same generated source share a pipeline, kernels with equal constants share a
//! read-only constants buffer, and launches over the same buffers reuse a bind group. Each map is
//! bounded: a program that meets ever new shapes empties the pipeline and bind-group maps when
//! they fill (plans keep their own `Arc`s, so emptying costs later plans a compile, never a live
//! plan its objects) and sweeps the constants map of dead entries as it grows.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::super::memory::{create_buffer, DevBuf};
use super::op::OP_IMMEDIATE_BYTES;
use super::shapes::{ShapeHistory, UNIFORM_CFG_BINDING};
use super::textures::{texture_binding, MatrixTextures};
use crate::error::{Error, Result};

/// One compiled pass.
pub(super) struct Pipe {
    pub(super) pipeline: wgpu::ComputePipeline,
}

/// Compiled passes with their grids.
pub(super) type Passes = Vec<(Arc<Pipe>, [u32; 3])>;

pub(super) type GroupKey = (u64, Vec<(u64, u64, u64)>);

/// The operator pipelines and bind groups of one device.
#[derive(Default)]
pub(crate) struct OpCache {
    /// Bind group layouts by tensor count (binding 0 is the constants) and the formats of the
    /// textures that follow the tensors ([`TexRead`](super::textures::TexRead)).
    layouts: Mutex<LayoutMap>,
    /// [`TexRead`](super::textures::TexRead) textures.
    pub(super) textures: Mutex<MatrixTextures>,
    /// Pipelines by source.
    pipes: Mutex<HashMap<String, Arc<Pipe>>>,
    /// Bind groups by (constants buffer, tensor windows).
    pub(super) groups: Arc<Mutex<HashMap<GroupKey, wgpu::BindGroup>>>,
    /// Bound in place of an empty tensor (a binding cannot be empty).
    pub(super) dummy: Mutex<Option<DevBuf>>,
    /// Constants buffers by their words (see [`OpCache::constants`]).
    constants: Mutex<ConstantsMap>,
    /// Which structures have met enough shapes to read numbers from their constants.
    pub(super) shapes: ShapeHistory,
}

/// [`OpCache`]'s constants buffers: each read-only once written, so kernels whose constants
/// are equal share one. Entries whose buffer every kernel has dropped are swept out when the
/// map has doubled since the last sweep.
#[derive(Default)]
struct ConstantsMap {
    buffers: HashMap<Vec<u32>, Weak<wgpu::Buffer>>,
    live_at_sweep: usize,
}

/// [`OpCache`]'s bind group layouts.
type LayoutMap =
    HashMap<(usize, Vec<wgpu::TextureFormat>), (wgpu::BindGroupLayout, wgpu::PipelineLayout)>;

/// Pipelines kept before the cache is emptied.
const MAX_CACHED_PIPELINES: usize = 1024;

/// Bind groups kept before the cache is emptied (each holds its buffers alive).
pub(super) const MAX_CACHED_GROUPS: usize = 4096;

impl OpCache {
    pub(super) fn layout(
        &self,
        device: &wgpu::Device,
        tensors: usize,
        textures: &[wgpu::TextureFormat],
    ) -> (wgpu::BindGroupLayout, wgpu::PipelineLayout) {
        let mut l = self.layouts.lock();
        l.entry((tensors, textures.to_vec()))
            .or_insert_with(|| {
                let mut entries: Vec<wgpu::BindGroupLayoutEntry> = (0..=tensors)
                    .map(|b| wgpu::BindGroupLayoutEntry {
                        binding: b as u32,
                        visibility: wgpu::ShaderStages::COMPUTE,
                        ty: wgpu::BindingType::Buffer {
                            ty: wgpu::BufferBindingType::Storage { read_only: b == 0 },
                            has_dynamic_offset: false,
                            min_binding_size: None,
                        },
                        count: None,
                    })
                    .collect();
                // The constants again, as a uniform buffer (read by shape-generic kernels).
                entries.push(wgpu::BindGroupLayoutEntry {
                    binding: UNIFORM_CFG_BINDING,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                });
                for (slot, format) in textures.iter().enumerate() {
                    let sample_type = match format {
                        wgpu::TextureFormat::Rgba16Uint => wgpu::TextureSampleType::Uint,
                        _ => wgpu::TextureSampleType::Float { filterable: false },
                    };
                    entries.push(wgpu::BindGroupLayoutEntry {
                        binding: texture_binding(tensors, slot),
                        visibility: wgpu::ShaderStages::COMPUTE,
                        ty: wgpu::BindingType::Texture {
                            sample_type,
                            view_dimension: wgpu::TextureViewDimension::D2,
                            multisampled: false,
                        },
                        count: None,
                    });
                }
                let bgl = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                    label: Some("unirt op"),
                    entries: &entries,
                });
                let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                    label: Some("unirt op"),
                    bind_group_layouts: &[Some(&bgl)],
                    immediate_size: OP_IMMEDIATE_BYTES,
                });
                (bgl, pl)
            })
            .clone()
    }

    pub(super) fn pipe(
        &self,
        device: &wgpu::Device,
        name: &str,
        source: &str,
        entry: &str,
        (layout, layout_key): (&wgpu::PipelineLayout, &str),
        zero_workgroup_memory: bool,
    ) -> Result<Arc<Pipe>> {
        // The layout is part of the key: the same source compiled for two layouts (a pass that
        // reads no texture, in a plan's texture variant and in its plain one) makes two
        // pipelines, each usable only with bind groups of its own layout.
        let key = format!("{entry}\n{zero_workgroup_memory}\n{layout_key}\n{source}");
        if let Some(p) = self.pipes.lock().get(&key) {
            return Ok(p.clone());
        }
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(name),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(name),
            layout: Some(layout),
            module: &module,
            entry_point: Some(entry),
            compilation_options: wgpu::PipelineCompilationOptions {
                zero_initialize_workgroup_memory: zero_workgroup_memory,
                ..Default::default()
            },
            cache: None,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::KernelCompile {
                kernel: name.into(),
                log: e.to_string(),
            });
        }
        let p = Arc::new(Pipe { pipeline });
        let mut pipes = self.pipes.lock();
        // Host forms write shapes into their code (`wgsl::view_index`), so a program that
        // sees ever new shapes would grow this map without end; plans hold their own pipelines,
        // so emptying it only costs later plans a compile.
        if pipes.len() >= MAX_CACHED_PIPELINES {
            pipes.clear();
        }
        pipes.insert(key, p.clone());
        Ok(p)
    }
}

impl OpCache {
    /// The constants buffer holding `words`: the one a live kernel already binds, or a new
    /// one. Every plan used to create its own (a buffer and its staging copy), so each eager
    /// operator paid for a buffer creation, and wgpu's sub-allocator, whose search is linear
    /// in the free ranges it holds, slowed down quadratically over a graph of 50 000 plans
    /// (planning its fused chains took 5 s instead of 0.2).
    pub(super) fn constants(
        &self,
        device: &wgpu::Device,
        words: &[u32],
        who: &str,
    ) -> Result<Arc<wgpu::Buffer>> {
        let mut map = self.constants.lock();
        if let Some(b) = map.buffers.get(words).and_then(Weak::upgrade) {
            return Ok(b);
        }
        // Whole 16-byte rows: the uniform binding reads `array<vec4<u32>, N>`.
        let bytes = ((words.len().max(1) * 4) as u64).next_multiple_of(16);
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::UNIFORM;
        let cfg = create_buffer(device, bytes, usage, true, who)?;
        {
            let mut view = cfg
                .slice(..)
                .get_mapped_range_mut()
                .map_err(|e| Error::Internal(format!("constants buffer not mapped: {e}")))?;
            let words: &[u8] = bytemuck::cast_slice(words);
            view.slice(..words.len()).copy_from_slice(words);
        }
        cfg.unmap();
        let cfg = Arc::new(cfg);
        if map.buffers.len() >= 2 * map.live_at_sweep.max(64) {
            map.buffers.retain(|_, b| b.strong_count() > 0);
            map.live_at_sweep = map.buffers.len();
        }
        map.buffers.insert(words.to_vec(), Arc::downgrade(&cfg));
        Ok(cfg)
    }

    /// Drops the cached bind groups that use buffer `id` (it is being freed), and the
    /// textures of reusable inputs read from it.
    pub fn forget_buffer(&self, id: u64) {
        self.textures.lock().forget_source(id);
        self.groups
            .lock()
            .retain(|k, _| k.0 != id && !k.1.iter().any(|(b, _, _)| *b == id));
    }
}
