//! The launch of an operator kernel (see `op.rs`'s module doc): the tensors' byte ranges
//! checked against the allocation table, each tensor's buffer bound whole or through a window,
//! the element offsets put in the immediates, the variant chosen (textured, quad or plain)
//! and the dispatches enqueued as stream commands.

use std::num::NonZeroU64;
use std::sync::Arc;

use super::super::fault::FAULT_BYTES;
use super::super::guard::guarded;
use super::super::memory::{ceil4, create_buffer, wgpu_error, DevBuf};
use super::super::stream::{enqueue, Cmd, Imm, TexCopy};
use super::super::WgpuBackend;
use super::op::{texture_binding, GroupKey, OpKernel, MAX_CACHED_GROUPS, MAX_TENSORS};
use super::shapes::UNIFORM_CFG_BINDING;
use super::textures::MatrixTexture;
use crate::checked::Pins;
use crate::error::{Error, Result};
use crate::hal::{DevicePtr, StreamId};
use crate::ops::KernelCall;

/// One bound tensor: buffer id, window offset and size.
struct Bound {
    buf: DevBuf,
    offset: u64,
    size: u64,
}

impl WgpuBackend {
    /// Enqueues one launch of an operator kernel (see the module doc); a wgpu panic meanwhile
    /// is an error (see `guard.rs`).
    pub(crate) fn launch_op(
        &self,
        k: &OpKernel,
        call: &KernelCall<'_>,
        ranges: &[(DevicePtr, u64)],
        stream: StreamId,
    ) -> Result<()> {
        guarded("launch an operator kernel", || {
            self.launch_op_unguarded(k, call, ranges, stream)
        })
    }

    fn launch_op_unguarded(
        &self,
        k: &OpKernel,
        call: &KernelCall<'_>,
        ranges: &[(DevicePtr, u64)],
        stream: StreamId,
    ) -> Result<()> {
        let s = self.stream(stream)?;
        let mut pins = Pins::new();
        let mut work = 0;
        for (p, len) in ranges {
            self.mem.device_range(p.0, *len, &mut pins)?;
            work += *len;
        }
        let gpu = &self.gpu;
        let fixed = &gpu.kernels;
        let cache = &fixed.ops;
        let mut imm = [0u32; 8];
        let mut bound = Vec::with_capacity(MAX_TENSORS);
        // The bytes the launch writes: its outputs' (every tensor's for a user kernel, whose
        // source may write what it binds), for the textures' contents (`contents.rs`).
        let mut writes = Vec::with_capacity(MAX_TENSORS);
        let first_written = if k.writes_inputs {
            0
        } else {
            call.inputs.len()
        };
        for (i, t) in call.inputs.iter().chain(call.outputs).enumerate() {
            let size = t.dtype.size() as u64;
            let span = t.layout.span_end().unwrap_or(0) as u64 * size;
            let start = t.ptr();
            let len = (t.base + span).saturating_sub(start);
            if t.layout.numel() == 0 || len == 0 {
                let mut slot = cache.dummy.lock();
                let dummy = match &*slot {
                    Some(d) => d.clone(),
                    None => {
                        let usage = wgpu::BufferUsages::STORAGE;
                        let b = create_buffer(&gpu.device, 16, usage, false, &gpu.name)?;
                        slot.insert(DevBuf::new(b, false)).clone()
                    }
                };
                drop(slot);
                bound.push(Bound {
                    buf: dummy,
                    offset: 0,
                    size: 16,
                });
                continue;
            }
            let (buf, off) = {
                let a = self
                    .mem
                    .device_range(start, len, &mut pins)?
                    .ok_or_else(|| Error::Internal("an empty tensor range".into()))?;
                (a.payload.clone(), start - a.base)
            };
            if i >= first_written {
                writes.push((buf.id, off, off + len));
            }
            let (w_off, w_size) = window(fixed.max_binding, fixed.binding_align, &buf, off, len)?;
            let rel = off - w_off;
            if rel % size != 0 {
                return Err(Error::Internal(format!(
                    "{}: tensor {i} is not element-aligned in its binding",
                    k.name
                )));
            }
            let slot = imm
                .get_mut(i)
                .ok_or_else(|| Error::Internal(format!("{}: too many tensors", k.name)))?;
            *slot = u32::try_from(rel / size).map_err(|_| tensor_too_large(len, fixed))?;
            bound.push(Bound {
                buf,
                offset: w_off,
                size: w_size,
            });
        }
        let tensors = bound.len();
        if let Some((buf, size)) = &k.scratch {
            bound.push(Bound {
                buf: buf.clone(),
                offset: 0,
                size: *size,
            });
        }
        if let Some(f) = &k.fault {
            bound.push(Bound {
                buf: f.buf.clone(),
                offset: 0,
                size: FAULT_BYTES,
            });
        }
        let quads = imm[..tensors].iter().all(|o| o % 4 == 0);
        // The texture variant where the quad variant would apply and every copy can start at
        // its input: the byte offset in the buffer, the window's start plus the element
        // offset, must be a multiple of the texel's bytes.
        let copies: Option<Vec<(Arc<MatrixTexture>, TexCopy)>> =
            k.textured.as_ref().filter(|_| quads).and_then(|t| {
                t.inputs
                    .iter()
                    .map(|s| {
                        let (b, elem) =
                            (bound.get(s.input)?, call.inputs.get(s.input)?.dtype.size());
                        let off = b.offset + u64::from(imm[s.input]) * elem as u64;
                        off.is_multiple_of(s.texel_bytes).then(|| {
                            let tex = if s.reusable {
                                cache.source_texture(gpu, s, b.buf.id, off)
                            } else {
                                s.tex.clone()
                            };
                            let copy = TexCopy {
                                src: b.buf.buffer.clone(),
                                src_id: b.buf.id,
                                src_off: off,
                                bytes_per_row: s.bytes_per_row,
                                texture: tex.texture.clone(),
                                held: tex.held.clone(),
                                reusable: s.reusable,
                                width: s.width,
                                height: s.height,
                                last_width: s.last_width,
                                texel_bytes: s.texel_bytes,
                            };
                            (tex, copy)
                        })
                    })
                    .collect()
            });
        let mut cmds = Vec::with_capacity(4);
        let (passes, group) = match (k.textured.as_ref().zip(copies), &k.aligned) {
            (Some((t, copies)), _) => {
                let tex: Vec<&MatrixTexture> = copies.iter().map(|(t, _)| &**t).collect();
                let group = self.op_group(k, &t.bgl, &bound, &tex)?;
                cmds.extend(copies.into_iter().map(|(_, c)| Cmd::ToTexture(c)));
                (&t.passes, group)
            }
            (None, Some(aligned)) if quads => (aligned, self.op_group(k, &k.bgl, &bound, &[])?),
            _ => (&k.passes, self.op_group(k, &k.bgl, &bound, &[])?),
        };
        cmds.extend(passes.iter().map(|(p, groups)| Cmd::Dispatch {
            pipeline: p.pipeline.clone(),
            group: group.clone(),
            imm: Imm { words: imm, len: 8 },
            groups: *groups,
        }));
        cmds.extend(k.fault.clone().map(Cmd::Check));
        enqueue(gpu, &s, cmds, &writes, pins, work, false)
    }

    /// The bind group of `bound` (and the textures `tex` after them) for layout `bgl`, cached.
    fn op_group(
        &self,
        k: &OpKernel,
        bgl: &wgpu::BindGroupLayout,
        bound: &[Bound],
        tex: &[&MatrixTexture],
    ) -> Result<wgpu::BindGroup> {
        let mut windows: Vec<(u64, u64, u64)> =
            bound.iter().map(|b| (b.buf.id, b.offset, b.size)).collect();
        // Texture ids come from the same counter as buffer ids: no window matches one.
        windows.extend(tex.iter().map(|t| (t.id, u64::MAX, 0)));
        let key: GroupKey = (k.cfg_id, windows);
        if let Some(g) = k.groups.lock().get(&key) {
            return Ok(g.clone());
        }
        let device = &self.gpu.device;
        let mut entries = Vec::with_capacity(bound.len() + 1 + tex.len());
        entries.push(wgpu::BindGroupEntry {
            binding: 0,
            resource: k.cfg.as_entire_binding(),
        });
        // The constants as a uniform buffer: as much as the adapter binds (a shape-generic
        // kernel, the one reader, has at most a quarter of WebGPU's default; see `shapes`).
        let limit = device.limits().max_uniform_buffer_binding_size / 16 * 16;
        entries.push(wgpu::BindGroupEntry {
            binding: UNIFORM_CFG_BINDING,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &k.cfg,
                offset: 0,
                size: NonZeroU64::new(k.cfg.size().min(limit)),
            }),
        });
        for (i, b) in bound.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &b.buf.buffer,
                    offset: b.offset,
                    size: NonZeroU64::new(b.size),
                }),
            });
        }
        for (slot, t) in tex.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: texture_binding(bound.len(), slot),
                resource: wgpu::BindingResource::TextureView(&t.view),
            });
        }
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("unirt op"),
            layout: bgl,
            entries: &entries,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(wgpu_error("create_bind_group", e));
        }
        let mut groups = k.groups.lock();
        if groups.len() >= MAX_CACHED_GROUPS {
            groups.clear();
        }
        groups.insert(key, group.clone());
        Ok(group)
    }
}

fn tensor_too_large(len: u64, k: &super::Kernels) -> Error {
    Error::TooLarge {
        device: "wgpu (one storage binding of an operator kernel)".into(),
        requested: len,
        limit: k.max_binding,
    }
}

/// The window `(offset, size)` of `buf` to bind for `len` bytes at byte `off`: the whole
/// buffer when it fits one binding, else from `off` aligned down.
fn window(max_binding: u64, align: u64, buf: &DevBuf, off: u64, len: u64) -> Result<(u64, u64)> {
    let size = buf.buffer.size();
    if size <= max_binding {
        return Ok((0, size));
    }
    let start = off - off % align;
    let end = ceil4(off + len).min(size);
    if end - start > max_binding {
        return Err(Error::TooLarge {
            device: format!(
                "wgpu (a tensor of an operator kernel must fit one storage binding: \
                 max_storage_buffer_binding_size {max_binding} bytes)"
            ),
            requested: len,
            limit: max_binding.saturating_sub(align),
        });
    }
    Ok((start, end - start))
}
