//! The kernels of [`crate::kernel::KERNELS`] in CUDA C, compiled by NVRTC at first use.
//!
//! Kernels live one op family per file under `kernels/` (`elementwise.cu`, …, the same names
//! as the other vendors' kernel files), each kernel an `extern "C" __global__` function named
//! as in [`crate::kernel::KERNELS`], built into the binary with `include_str!`. A kernel is
//! compiled from its family's file and fetched by name. A compiled image is cached in
//! memory (per process) and on disk under `$XDG_CACHE_HOME/unirt/cuda` (or
//! `~/.cache/unirt/cuda`), keyed by a SHA-256 of the source, the target architecture, the
//! NVRTC version and the options, so a second process skips the ~0.1 s compile. The cache
//! directory is created mode 0700 and used only when it is owned by this user and not writable
//! by anyone else: a cached image is code the GPU will run.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use super::nvrtc::{Nvrtc, Target};
use crate::error::{Error, Result};

/// One kernel's CUDA C source.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// The kernel (and `__global__` function) name, as in [`crate::kernel::KERNELS`].
    pub name: &'static str,
    /// The file under `vendors/cuda/kernels/`.
    pub file: &'static str,
    pub source: &'static str,
}

/// The elementwise op family.
const ELEMENTWISE: &str = include_str!("kernels/elementwise.cu");

/// Every CUDA kernel, in the order of [`crate::kernel::KERNELS`].
pub const SOURCES: &[KernelSource] = &[
    KernelSource {
        name: "fill",
        file: "elementwise.cu",
        source: ELEMENTWISE,
    },
    KernelSource {
        name: "add_f32",
        file: "elementwise.cu",
        source: ELEMENTWISE,
    },
];

/// The source of a kernel by name.
pub fn source(name: &str) -> Result<&'static KernelSource> {
    SOURCES
        .iter()
        .find(|k| k.name == name)
        .ok_or_else(|| Error::BadParam(format!("the cuda backend has no kernel {name:?}")))
}

type ImageKey = (&'static str, Target);

fn memory_cache() -> &'static Mutex<HashMap<ImageKey, Arc<Vec<u8>>>> {
    static CACHE: OnceLock<Mutex<HashMap<ImageKey, Arc<Vec<u8>>>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The options string that is part of the cache key (keep in step with `Nvrtc::compile`).
const OPTIONS_KEY: &str = "--std=c++14";

fn cache_key(nv: &Nvrtc, k: &KernelSource, target: Target) -> String {
    let mut h = Sha256::new();
    for part in [k.source, &target.arch(), &nv.version_string(), OPTIONS_KEY] {
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

fn cache_file(dir: &Path, nv: &Nvrtc, k: &KernelSource, target: Target) -> PathBuf {
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
pub fn image(
    nv: &Nvrtc,
    k: &'static KernelSource,
    target: Target,
    fresh: bool,
) -> Result<Arc<Vec<u8>>> {
    image_in(nv, k, target, fresh, cache_dir())
}

fn image_in(
    nv: &Nvrtc,
    k: &'static KernelSource,
    target: Target,
    fresh: bool,
    dir: Option<PathBuf>,
) -> Result<Arc<Vec<u8>>> {
    let key = (k.name, target);
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
    let (bytes, log) = nv.compile(k.file, k.source, target)?;
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

/// One kernel compiled for one architecture ahead of time.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CompiledKernel {
    /// The kernel's name, as in [`crate::kernel::KERNELS`].
    pub kernel: String,
    /// `sm_XY`.
    pub arch: String,
    /// The source file under `vendors/cuda/kernels/` it was compiled from.
    pub file: String,
    /// Whether NVRTC produced a CUBIN holding this kernel.
    pub ok: bool,
    /// NVRTC's log (empty when it had nothing to say).
    pub log: String,
    /// Size of the CUBIN in bytes (0 on failure).
    pub bytes: usize,
}

/// Compiles every kernel file to CUBIN for each `sm_XY` in `archs`, without a GPU and without
/// any cache: this is the check that the sources are valid CUDA C for those architectures.
/// Each file is compiled once per architecture; each of its kernels gets a row, which fails
/// when the image does not hold the kernel's symbol.
pub(crate) fn compile_all(nv: &Nvrtc, archs: &[u32]) -> Vec<CompiledKernel> {
    let mut rows = Vec::new();
    for &arch in archs {
        let target = Target::Cubin(arch);
        let mut by_file: HashMap<&str, std::result::Result<(Vec<u8>, String), String>> =
            HashMap::new();
        for k in SOURCES {
            let compiled = by_file.entry(k.file).or_insert_with(|| {
                nv.compile(k.file, k.source, target).map_err(|e| match e {
                    Error::KernelCompile { log, .. } => log,
                    other => other.to_string(),
                })
            });
            let row = match compiled {
                Ok((img, log)) => CompiledKernel {
                    kernel: k.name.into(),
                    arch: target.arch(),
                    file: k.file.into(),
                    // A CUBIN is an ELF image whose symbol table names its kernels.
                    ok: img.starts_with(b"\x7fELF")
                        && img.windows(k.name.len()).any(|w| w == k.name.as_bytes()),
                    log: log.clone(),
                    bytes: img.len(),
                },
                Err(log) => CompiledKernel {
                    kernel: k.name.into(),
                    arch: target.arch(),
                    file: k.file.into(),
                    ok: false,
                    log: log.clone(),
                    bytes: 0,
                },
            };
            rows.push(row);
        }
    }
    rows
}

/// Parses `sm_70,sm_80,90` into `[70, 80, 90]`.
pub fn parse_archs(list: &str) -> Result<Vec<u32>> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            let digits = s.strip_prefix("sm_").unwrap_or(s);
            digits
                .parse::<u32>()
                .ok()
                .filter(|&v| (10..=200).contains(&v))
                .ok_or_else(|| Error::BadParam(format!("bad architecture {s:?} (expected sm_XY)")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_has_cuda_source() {
        for sig in crate::kernel::KERNELS {
            let k = source(sig.name).unwrap();
            assert!(
                k.source.contains(&format!("void {}(", sig.name)),
                "{}",
                k.file
            );
        }
        assert_eq!(SOURCES.len(), crate::kernel::KERNELS.len());
    }

    /// A compile error is `KernelCompile` carrying NVRTC's log (when NVRTC is installed).
    #[test]
    fn compile_errors_carry_the_log() {
        let Ok(nv) = crate::vendors::cuda::nvrtc::nvrtc() else {
            eprintln!("skipped: NVRTC not found");
            return;
        };
        let bad = "extern \"C\" __global__ void broken(int *p) { p[0] = undeclared_name; }";
        match nv.compile("broken.cu", bad, Target::Cubin(80)) {
            Err(Error::KernelCompile { kernel, log }) => {
                assert!(kernel.contains("broken.cu"), "{kernel}");
                assert!(log.contains("undeclared_name"), "{log}");
            }
            other => panic!("expected KernelCompile, got {other:?}"),
        }
        let rows = compile_all(nv, &[80]);
        assert!(rows.iter().all(|r| r.ok && r.bytes > 0), "{rows:?}");
        let rows = compile_all(nv, &[12]);
        assert!(rows.iter().all(|r| !r.ok && !r.log.is_empty()), "{rows:?}");
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
        let k = source("fill").unwrap();
        // sm_75 is used by no other test, so the shared memory cache starts without it.
        let target = Target::Cubin(75);
        let img = image_in(nv, k, target, true, Some(dir.clone())).unwrap();
        assert!(img.starts_with(b"\x7fELF"));
        let file = cache_file(&dir, nv, k, target);
        assert_eq!(std::fs::read(&file).unwrap(), *img);
        // Mark the disk copy, forget the memory copy: the next lookup must come from disk.
        std::fs::write(&file, b"from disk").unwrap();
        memory_cache().lock().remove(&(k.name, target));
        let again = image_in(nv, k, target, false, Some(dir.clone())).unwrap();
        assert_eq!(&again[..], b"from disk");
        // `fresh` recompiles and repairs the entry.
        let repaired = image_in(nv, k, target, true, Some(dir.clone())).unwrap();
        assert_eq!(*repaired, *img);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn arch_lists_parse() {
        assert_eq!(parse_archs("sm_70, sm_80,90").unwrap(), [70, 80, 90]);
        assert!(parse_archs("sm_x").is_err());
    }
}
