//! Launches of the HAL's fixed kernels (`fill`, `add_f32`, …) on wgpu: the arguments checked
//! against the allocation table, each buffer argument resolved to its allocation once, and one
//! prepared dispatch enqueued.

use super::contents;
use super::memory::DevBuf;
use super::stream::{enqueue, Cmd};
use super::{kernels, memory, stream, WgpuBackend};
use crate::checked::Pins;
use crate::error::{Error, Result};
use crate::hal::*;
use crate::kernel::check_launch;

impl WgpuBackend {
    pub(super) fn raw_launch(
        &self,
        kernel: &str,
        args: &[KernelArg],
        stream: StreamId,
    ) -> Result<()> {
        let s = self.stream(stream)?;
        let mut pins = Pins::new();
        let checked = check_launch(kernel, args, |p, len| {
            self.mem.device_range(p.0, len, &mut pins).map(drop)
        })?;
        let which = kernels::Which::public(kernel)?;
        if checked.n == 0 {
            return Ok(());
        }
        let k = &self.gpu.kernels;
        let len = u64::from(checked.n) * 4;
        // The allocations check_launch pinned: one per buffer argument, in order (every range
        // is non-empty, as n > 0), so nothing is looked up twice.
        let mut resolved: [Option<(&DevBuf, u64)>; 3] = [None; 3];
        let mut nbuf = 0;
        for ((p, _), a) in checked.buffers.iter().zip(pins.device()) {
            let slot = resolved
                .get_mut(nbuf)
                .ok_or_else(|| Error::Internal("a kernel with over 3 buffers".into()))?;
            *slot = Some((&a.payload, p.0 - a.base));
            nbuf += 1;
        }
        let Some((first, _)) = resolved[0] else {
            return Err(Error::Internal("a kernel without buffers".into()));
        };
        if nbuf != checked.buffers.len() {
            return Err(Error::Internal(
                "kernel buffers and their pins disagree".into(),
            ));
        }
        // Bound exactly at each pointer when alignment allows (the faster kernel variant),
        // else windows with the element offsets passed as immediates.
        let dummy = kernels::Window {
            buf: first,
            offset: 0,
            size: 0,
        };
        let mut windows = [dummy; 3];
        let mut rels = [0u64; 3];
        let mut is_direct = true;
        for (i, (buf, off)) in resolved.iter().flatten().enumerate() {
            match k.direct_window(buf, *off, len) {
                Some(w) => windows[i] = w,
                None => {
                    is_direct = false;
                    break;
                }
            }
        }
        if !is_direct {
            for (i, (buf, off)) in resolved.iter().flatten().enumerate() {
                (windows[i], rels[i]) = k.window(buf, *off, len)?;
            }
        }
        let mut imm = [0u32; 4];
        let mut slot = 0;
        let mut rels = rels[..nbuf].iter();
        for (i, a) in args.iter().enumerate() {
            match a {
                KernelArg::Ptr(_) => {
                    if let Some(x) = imm.get_mut(slot) {
                        *x = (rels.next().copied().unwrap_or(0) / 4) as u32;
                    }
                    slot += 1;
                }
                KernelArg::U32(v) if i != checked.signature.count => {
                    if let Some(x) = imm.get_mut(slot) {
                        *x = *v;
                    }
                    slot += 1;
                }
                KernelArg::F32(v) => {
                    if let Some(x) = imm.get_mut(slot) {
                        *x = v.to_bits();
                    }
                    slot += 1;
                }
                KernelArg::U32(_) => {}
                // check_launch admits only the built-in kernels' Ptr/U32/F32 parameters.
                _ => {}
            }
        }
        // The count goes last, as every kernel's Params has it.
        imm[slot.min(3)] = checked.n;
        let which = match which {
            kernels::Which::AddF32
                if nbuf == 3
                    && windows[2].buf.id != windows[0].buf.id
                    && windows[2].buf.id != windows[1].buf.id =>
            {
                kernels::Which::AddF32NoAlias
            }
            w => w,
        };
        // Bound at every pointer, add_f32 runs without immediates: `out` bound to exactly its
        // n elements gives the count (see kernels/fixed.rs). Its last buffer is `out`.
        let (which, imm) = match which.sized() {
            Some(sized) if is_direct => {
                windows[nbuf - 1].size = memory::ceil4(len);
                (sized, stream::Imm::NONE)
            }
            _ => (which, stream::Imm::four(imm)),
        };
        let windows = &windows[..nbuf];
        let pipeline = k.pipeline_variant(&self.gpu.device, which, is_direct)?;
        let group = k.bind_group(&self.gpu.device, which, windows)?;
        let cmd = Cmd::Dispatch {
            pipeline,
            group,
            imm,
            groups: k.groups_for(u64::from(checked.n)),
        };
        let work = checked.buffers.iter().map(|(_, l)| *l).sum();
        // Which arguments a kernel writes is its own business: every buffer it binds counts as
        // written, whole (see `contents.rs`).
        let writes: Vec<(u64, u64, u64)> = pins
            .device()
            .map(|a| (a.payload.id, 0, contents::WHOLE))
            .collect();
        enqueue(&self.gpu, &s, [cmd], &writes, pins, work, false)
    }
}
