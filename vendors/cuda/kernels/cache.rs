//! The compiled-image cache: every CUDA image (a HAL kernel's file, or an op family's source
//! generated for one dtype) is cached in memory (per process) and on disk under
//! `$XDG_CACHE_HOME/unirt/cuda` (or `~/.cache/unirt/cuda`), keyed by a SHA-256 of the source,
//! the target architecture, the NVRTC version and the options, so a second process skips the
//! compile. The cache directory is created mode 0700 and used only when it is owned by this
//! user and not writable by anyone else: a cached image is code the GPU will run.

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

fn cache_key(nv: &Nvrtc, k: &Source<'_>, target: Target) -> String {
    let mut h = Sha256::new();
    for part in [k.text, &target.arch(), &nv.version_string(), OPTIONS_KEY] {
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

/// Writes through a temporary file and a rename, so a reader never sees half an image.
fn store(path: &Path, image: &[u8]) {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, image).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
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
        if let Some(bytes) = file.as_ref().and_then(|f| std::fs::read(f).ok()) {
            if !bytes.is_empty() {
                let img = Arc::new(bytes);
                memory_cache().lock().insert(key, img.clone());
                return Ok(img);
            }
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
        assert_eq!(std::fs::read(&file).unwrap(), *img);
        // Mark the disk copy, forget the memory copy: the next lookup must come from disk.
        std::fs::write(&file, b"from disk").unwrap();
        memory_cache().lock().remove(&(k.name.to_string(), target));
        let again = image_in(nv, &k, target, false, Some(dir.clone())).unwrap();
        assert_eq!(&again[..], b"from disk");
        // `fresh` recompiles and repairs the entry.
        let repaired = image_in(nv, &k, target, true, Some(dir.clone())).unwrap();
        assert_eq!(*repaired, *img);
        std::fs::remove_dir_all(&base).unwrap();
    }
}
