//! Reading what a CUBIN says about its kernels. A CUBIN is an ELF image; each kernel has a
//! `.nv.info.<name>` section of attributes, among them `EIATTR_CBANK_PARAM_SIZE` (the bytes of
//! its parameters: an ahead-of-time build checks that the host side builds exactly the
//! parameters the device code declares — a by-value struct of the wrong size would be read past
//! its end on the GPU), and the image-wide `.nv.info` holds per-kernel `EIATTR_REGCOUNT` and
//! `EIATTR_FRAME_SIZE` (registers per thread, and local memory per thread — spills among it),
//! which unit tests check without a GPU: registers decide how many blocks a multiprocessor
//! holds, and so a memory-bound kernel's bandwidth.

/// `EIATTR_CBANK_PARAM_SIZE`.
const CBANK_PARAM_SIZE: u8 = 0x19;
/// `EIATTR_FRAME_SIZE`: (symbol, bytes of local memory per thread).
#[cfg(test)]
const FRAME_SIZE: u8 = 0x11;
/// `EIATTR_REGCOUNT`: (symbol, registers per thread).
#[cfg(test)]
const REGCOUNT: u8 = 0x2f;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The bytes of `kernel`'s parameters in the 64-bit ELF `img`, or `None` when the image does
/// not say (not ELF64, no such kernel, no such attribute).
pub fn param_bytes(img: &[u8], kernel: &str) -> Option<u32> {
    let want = format!(".nv.info.{kernel}");
    let (_, _, _, off, size) = sections(img)?.into_iter().find(|s| s.0 == want)?;
    let attrs = img.get(off..off.checked_add(size)?)?;
    let mut at = 0;
    while at + 4 <= attrs.len() {
        let (format, attr) = (attrs[at], attrs[at + 1]);
        if format == 0x03 && attr == CBANK_PARAM_SIZE {
            return u16_at(attrs, at + 2).map(u32::from);
        }
        // EIFMT_SVAL carries a 16-bit size and that many bytes; the others fit in 4.
        at += if format == 0x04 {
            4 + u16_at(attrs, at + 2)? as usize
        } else {
            4
        };
    }
    None
}

/// Registers and local memory per thread of one kernel, as its CUBIN records them.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resources {
    pub registers: u32,
    /// Local memory per thread (a stack frame: spilled registers, arrays indexed at run time).
    pub frame_bytes: u32,
}

/// One ELF section: (name, type, link, data offset, size).
type Section = (String, u32, usize, usize, usize);

/// The sections of a 64-bit ELF image.
fn sections(img: &[u8]) -> Option<Vec<Section>> {
    if !img.starts_with(b"\x7fELF") || img.get(4) != Some(&2) {
        return None;
    }
    let shoff = usize::try_from(u64_at(img, 0x28)?).ok()?;
    let (entsize, count, strndx) = (
        u16_at(img, 0x3a)? as usize,
        u16_at(img, 0x3c)? as usize,
        u16_at(img, 0x3e)? as usize,
    );
    let raw = |i: usize| -> Option<(usize, u32, usize, usize, usize)> {
        let at = shoff.checked_add(i.checked_mul(entsize)?)?;
        Some((
            u32_at(img, at)? as usize,
            u32_at(img, at + 4)?,
            u32_at(img, at + 0x28)? as usize,
            usize::try_from(u64_at(img, at + 0x18)?).ok()?,
            usize::try_from(u64_at(img, at + 0x20)?).ok()?,
        ))
    };
    let names = raw(strndx)?.3;
    (0..count)
        .map(|i| {
            let (name, kind, link, off, size) = raw(i)?;
            Some((c_str(img, names.checked_add(name)?)?, kind, link, off, size))
        })
        .collect()
}

/// The NUL-terminated string at `at`.
fn c_str(img: &[u8], at: usize) -> Option<String> {
    let rest = img.get(at..)?;
    let end = rest.iter().position(|&b| b == 0)?;
    Some(String::from_utf8_lossy(&rest[..end]).into_owned())
}

/// `kernel`'s registers and local memory per thread in the CUBIN `img`, or `None` when the
/// image does not say (the unit tests' check of occupancy without a GPU).
#[cfg(test)]
pub fn resources(img: &[u8], kernel: &str) -> Option<Resources> {
    let secs = sections(img)?;
    // SHT_SYMTAB: 24-byte entries, names in the section it links to.
    let &(_, _, link, off, size) = secs.iter().find(|s| s.1 == 2)?;
    let names = secs.get(link)?.3;
    let symbol = (0..size / 24).find(|i| {
        u32_at(img, off + i * 24)
            .and_then(|n| c_str(img, names + n as usize))
            .is_some_and(|n| n == kernel)
    })? as u32;
    let (_, _, _, off, size) = secs.iter().find(|s| s.0 == ".nv.info")?;
    let attrs = img.get(*off..off.checked_add(*size)?)?;
    let (mut registers, mut frame_bytes, mut at) = (None, None, 0);
    while at + 4 <= attrs.len() {
        let (format, attr) = (attrs[at], attrs[at + 1]);
        let step = if format == 0x04 {
            4 + u16_at(attrs, at + 2)? as usize
        } else {
            4
        };
        if format == 0x04 && step == 12 && u32_at(attrs, at + 4)? == symbol {
            let value = u32_at(attrs, at + 8)?;
            match attr {
                REGCOUNT => registers = Some(value),
                FRAME_SIZE => frame_bytes = Some(value),
                _ => {}
            }
        }
        at += step;
    }
    Some(Resources {
        registers: registers?,
        frame_bytes: frame_bytes.unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_kernels_declare_their_parameters() {
        let Ok(nv) = crate::vendors::cuda::nvrtc::nvrtc() else {
            eprintln!("skipped: NVRTC not found");
            return;
        };
        let target = crate::vendors::cuda::nvrtc::Target::Cubin(80);
        let (img, _) = nv
            .compile("builtin.cu", include_str!("builtin.cu"), target)
            .unwrap();
        // fill(u32*, u32, u32) and add_f32(f32*, f32*, f32*, u32).
        assert_eq!(param_bytes(&img, "fill"), Some(16));
        assert_eq!(param_bytes(&img, "add_f32"), Some(28));
        assert_eq!(param_bytes(&img, "missing"), None);
        assert_eq!(param_bytes(b"not an image", "fill"), None);
        let fill = resources(&img, "fill").expect("fill's resources");
        assert!(fill.registers > 0 && fill.registers <= 255, "{fill:?}");
        assert_eq!(fill.frame_bytes, 0);
        assert_eq!(resources(&img, "missing"), None);
    }
}
