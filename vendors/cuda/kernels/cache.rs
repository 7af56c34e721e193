//! The compiled-image cache: every CUDA image (a HAL kernel's file, or an op family's source
//! generated for one dtype) is cached in memory (per process) and on disk under
//! `$XDG_CACHE_HOME/unirt/cuda` (or `~/.cache/unirt/cuda`), keyed by a SHA-256 of the source,
//! the target architecture, the NVRTC version and the options, so a second process skips the
//! compile. The cache directory is created mode 0700 and used only when it is owned by this
//! user and not writable by anyone else: a cached image is code the GPU will run.
//!
//! Each file is *sealed*: a magic, the image's length and its SHA-256 precede the image, and a
//! file whose seal does not match (truncated by a full disk, damaged, written by something
//! else) is deleted and compiled again. The driver is never handed such bytes: a CUBIN is an
//! ELF image whose header tells libcuda where its sections lie, so a truncated one would send
//! `cuModuleLoadData` reading past the buffer — a crash in the driver, not an error code.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use super::super::nvrtc::{Nvrtc, Target};
use crate::error::Result;

/// A CUDA C source to compile: a name that keys the caches (unique per distinct source),
/// the file name NVRTC reports in its log, and the text.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    pub name: &'a str,
    pub file: &'a str,
    pub text: &'a str,
}

type ImageKey = (String, Target);

fn memory_cache() -> &'static Mutex<HashMap<ImageKey, Arc<Vec<u8>>>> {
    static CACHE: OnceLock<Mutex<HashMap<ImageKey, Arc<Vec<u8>>>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The options string that is part of the cache key (keep in step with `Nvrtc::compile`).
const OPTIONS_KEY: &str = "--std=c++14";

/// The on-disk format, part of the key: files of another format (the unsealed images of
/// earlier versions) have other names, so no version reads another's files.
const FORMAT_KEY: &str = "sealed-1";

/// The first bytes of a sealed file; then the image's length (u64, little-endian), its
/// SHA-256, and the image.
const SEAL_MAGIC: &[u8; 8] = b"unirtimg";
const SEAL_LEN: usize = 8 + 8 + 32;

fn cache_key(nv: &Nvrtc, k: &Source<'_>, target: Target) -> String {
    let mut h = Sha256::new();
    for part in [
        k.text,
        &target.arch(),
        &nv.version_string(),
        OPTIONS_KEY,
        FORMAT_KEY,
    ] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    h.finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// This process's effective uid, from `/proc/self/status` (no libc binding needed).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// The disk cache directory, created 0700; `None` when it cannot be made safe.
pub fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
                .map(|h| h.join(".cache"))
        })?;
    cache_dir_in(&base)
}

/// Without Unix permissions the cache cannot be made private: memory only.
#[cfg(not(unix))]
fn cache_dir_in(_base: &Path) -> Option<PathBuf> {
    None
}

/// `base/unirt/cuda`, created 0700, when it is ours and private.
#[cfg(unix)]
fn cache_dir_in(base: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let dir = base.join("unirt").join("cuda");
    if let Err(e) = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
    {
        tracing::warn!("cuda kernel cache {} unusable: {e}", dir.display());
        return None;
    }
    let meta = std::fs::metadata(&dir).ok()?;
    if Some(meta.uid()) != effective_uid() {
        tracing::warn!(
            "cuda kernel cache {} is not owned by this user; not used",
            dir.display()
        );
        return None;
    }
    if meta.mode() & 0o077 != 0
        && std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).is_err()
    {
        return None;
    }
    Some(dir)
}

fn cache_file(dir: &Path, nv: &Nvrtc, k: &Source<'_>, target: Target) -> PathBuf {
    let ext = match target {
        Target::Cubin(_) => "cubin",
        Target::Ptx(_) => "ptx",
    };
    dir.join(format!(
        "{}-{}-{}.{ext}",
        k.name,
        target.arch(),
        cache_key(nv, k, target)
    ))
}

/// `image` behind its seal (see the module docs).
fn seal(image: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(SEAL_LEN + image.len());
    out.extend_from_slice(SEAL_MAGIC);
    out.extend_from_slice(&(image.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(image));
    out.extend_from_slice(image);
    out
}

/// The image inside a sealed file, or `None` when the seal does not match the bytes (an
/// empty image is refused too: NVRTC never produces one).
fn unseal(file: &[u8]) -> Option<&[u8]> {
    let (head, image) = file.split_at_checked(SEAL_LEN)?;
    let (magic, rest) = head.split_at(8);
    let (len, digest) = rest.split_at(8);
    let len = u64::from_le_bytes(len.try_into().ok()?);
    let whole = magic == SEAL_MAGIC
        && len == image.len() as u64
        && !image.is_empty()
        && Sha256::digest(image).as_slice() == digest;
    whole.then_some(image)
}

/// Writes through a temporary file and a rename, so a reader never sees half an image; a
/// write that fails (a full disk) leaves no temporary file behind.
fn store(path: &Path, image: &[u8]) {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, seal(image)).is_err() || std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// The image cached in `path`, when the file is there and its seal holds. A file whose seal
/// fails is removed (it is recompiled and stored again by the caller).
fn load(path: &Path) -> Option<Vec<u8>> {
    let bytes = std::fs::read(path).ok()?;
    match unseal(&bytes) {
        Some(image) => Some(image.to_vec()),
        None => {
            tracing::warn!(
                "cuda kernel cache {}: damaged ({} bytes, seal does not match); compiling again",
                path.display(),
                bytes.len()
            );
            let _ = std::fs::remove_file(path);
            None
        }
    }
}

/// The compiled image of `k` for `target`: from memory, else disk, else NVRTC (then cached).
/// `fresh` skips both caches (used after a cached image failed to load).
pub fn image(nv: &Nvrtc, k: &Source<'_>, target: Target, fresh: bool) -> Result<Arc<Vec<u8>>> {
    image_in(nv, k, target, fresh, cache_dir())
}

fn image_in(
    nv: &Nvrtc,
    k: &Source<'_>,
    target: Target,
    fresh: bool,
    dir: Option<PathBuf>,
) -> Result<Arc<Vec<u8>>> {
    let key = (k.name.to_string(), target);
    if !fresh {
        if let Some(img) = memory_cache().lock().get(&key) {
            return Ok(img.clone());
        }
    }
    let file = dir.as_ref().map(|d| cache_file(d, nv, k, target));
    if !fresh {
        if let Some(bytes) = file.as_deref().and_then(load) {
            let img = Arc::new(bytes);
            memory_cache().lock().insert(key, img.clone());
            return Ok(img);
        }
    }
    let (bytes, log) = nv.compile(k.file, k.text, target)?;
    if !log.trim().is_empty() {
        tracing::debug!("nvrtc {} ({}): {}", k.file, target.arch(), log.trim());
    }
    if let Some(f) = &file {
        store(f, &bytes);
    }
    let img = Arc::new(bytes);
    memory_cache().lock().insert(key, img.clone());
    Ok(img)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seal holds for exactly the bytes it was made for.
    #[test]
    fn seal_matches_only_its_image() {
        let image = b"\x7fELF and the rest of an image".to_vec();
        let sealed = seal(&image);
        assert_eq!(unseal(&sealed), Some(&image[..]));
        for cut in 0..sealed.len() {
            assert_eq!(unseal(&sealed[..cut]), None, "cut at {cut}");
        }
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 1;
            assert_eq!(unseal(&bad), None, "byte {i} flipped");
        }
        let mut longer = sealed.clone();
        longer.push(0);
        assert_eq!(unseal(&longer), None);
        assert_eq!(unseal(&seal(b"")), None, "an empty image is never valid");
    }

    /// Images land in a private directory and a later process (an empty memory cache) reads
    /// them back from disk instead of compiling.
    #[cfg(unix)]
    #[test]
    fn disk_cache_is_private_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let Ok(nv) = crate::vendors::cuda::nvrtc::nvrtc() else {
            eprintln!("skipped: NVRTC not found");
            return;
        };
        let base = std::env::temp_dir().join(format!("unirt-cache-{}", std::process::id()));
        let dir = cache_dir_in(&base).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        let k = Source {
            name: "fill",
            file: "builtin.cu",
            text: include_str!("builtin.cu"),
        };
        // sm_75 is used by no other test, so the shared memory cache starts without it.
        let target = Target::Cubin(75);
        let img = image_in(nv, &k, target, true, Some(dir.clone())).unwrap();
        assert!(img.starts_with(b"\x7fELF"));
        let file = cache_file(&dir, nv, &k, target);
        assert_eq!(std::fs::read(&file).unwrap(), seal(&img));
        let forget = || memory_cache().lock().remove(&(k.name.to_string(), target));
        // Mark the disk copy, forget the memory copy: the next lookup must come from disk.
        std::fs::write(&file, seal(b"from disk")).unwrap();
        forget();
        let again = image_in(nv, &k, target, false, Some(dir.clone())).unwrap();
        assert_eq!(&again[..], b"from disk");
        // `fresh` recompiles and repairs the entry.
        let repaired = image_in(nv, &k, target, true, Some(dir.clone())).unwrap();
        assert_eq!(*repaired, *img);
        // Damaged files never reach the caller: each is compiled again and the entry repaired.
        let sealed = seal(&img);
        let mut flipped = sealed.clone();
        *flipped.last_mut().unwrap() ^= 0x40;
        let damaged: [(&str, Vec<u8>); 5] = [
            ("truncated", sealed[..sealed.len() - 100].to_vec()),
            ("one bit flipped", flipped),
            ("unsealed (an earlier format)", img.to_vec()),
            ("seal only", sealed[..SEAL_LEN].to_vec()),
            ("empty", Vec::new()),
        ];
        for (what, bytes) in damaged {
            std::fs::write(&file, bytes).unwrap();
            forget();
            let got = image_in(nv, &k, target, false, Some(dir.clone())).unwrap();
            assert_eq!(*got, *img, "{what}");
            assert_eq!(
                std::fs::read(&file).unwrap(),
                sealed,
                "{what}: entry repaired"
            );
        }
        std::fs::remove_dir_all(&base).unwrap();
    }
}
