//! Reading a kernel's parameter size back from a CUBIN, so an ahead-of-time build checks that
//! the host side builds exactly the parameters the device code declares (a by-value struct of
//! the wrong size would be read past its end on the GPU). A CUBIN is an ELF image; each kernel
//! has a `.nv.info.<name>` section of attributes, among them `EIATTR_CBANK_PARAM_SIZE`: the
//! bytes of its parameters.

/// `EIATTR_CBANK_PARAM_SIZE`.
const CBANK_PARAM_SIZE: u8 = 0x19;

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
    if !img.starts_with(b"\x7fELF") || img.get(4) != Some(&2) {
        return None;
    }
    let shoff = usize::try_from(u64_at(img, 0x28)?).ok()?;
    let (entsize, count, strndx) = (
        u16_at(img, 0x3a)? as usize,
        u16_at(img, 0x3c)? as usize,
        u16_at(img, 0x3e)? as usize,
    );
    // (name offset, data offset, size) of section i.
    let section = |i: usize| -> Option<(usize, usize, usize)> {
        let at = shoff.checked_add(i.checked_mul(entsize)?)?;
        Some((
            u32_at(img, at)? as usize,
            usize::try_from(u64_at(img, at + 0x18)?).ok()?,
            usize::try_from(u64_at(img, at + 0x20)?).ok()?,
        ))
    };
    let names = section(strndx)?.1;
    let want = format!(".nv.info.{kernel}");
    for i in 0..count {
        let (name, off, size) = section(i)?;
        let start = names.checked_add(name)?;
        let end = start + img.get(start..)?.iter().position(|&b| b == 0)?;
        if img.get(start..end)? != want.as_bytes() {
            continue;
        }
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
        return None;
    }
    None
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
    }
}
