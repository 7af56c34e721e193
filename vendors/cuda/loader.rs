//! Finding libcuda and NVRTC on disk: our own search, by absolute path only.
//!
//! cudarc finds its libraries by bare name and panics when none loads; its NVRTC name list also
//! misses Debian's `libnvrtc.so.11.2`. So unirt searches itself, in the order a person would
//! expect, and reports every place it looked when nothing is found. Only absolute paths are
//! ever opened: a bare name would let the dynamic linker consult the current directory (an
//! empty `LD_LIBRARY_PATH` element means "here").
//!
//! Overrides (for tests and unusual installs): `UNIRT_CUDA_LIBRARY` and `UNIRT_NVRTC_LIBRARY`
//! name the one file to load; when set, nothing else is searched, so a nonexistent path hides
//! the library.

use std::path::{Path, PathBuf};

/// The override for libcuda.
pub const CUDA_ENV: &str = "UNIRT_CUDA_LIBRARY";
/// The override for NVRTC.
pub const NVRTC_ENV: &str = "UNIRT_NVRTC_LIBRARY";
/// The override for cuBLAS (an empty file name such as `/dev/null/none` hides it).
pub const CUBLAS_ENV: &str = "UNIRT_CUBLAS_LIBRARY";

/// Where a search looked and what it found.
#[derive(Debug, Clone)]
pub struct Search {
    /// Files that exist and may be the library, best first.
    pub candidates: Vec<PathBuf>,
    /// Human description of every place looked at, for the "not found" reason.
    pub searched: Vec<String>,
}

impl Search {
    /// What was searched, short enough for one line: the place itself when there was one (an
    /// override), else the count and where the whole list is (`unirt devices --verbose`).
    pub fn describe(&self) -> String {
        match self.searched.as_slice() {
            [one] => format!("searched {one}"),
            all => format!(
                "searched {} places; `unirt devices --verbose` lists them",
                all.len()
            ),
        }
    }
}

/// The most likely fix when `what` (as [`open_first`] names it) is not found.
fn fix_for(what: &str) -> &'static str {
    match what {
        "libcuda" => {
            "install the NVIDIA driver, or set UNIRT_CUDA_LIBRARY to libcuda's absolute path"
        }
        "NVRTC" => {
            "install CUDA's NVRTC (the toolkit, Debian's libnvrtc, or the nvidia-cuda-nvrtc \
             Python wheel), or set UNIRT_NVRTC_LIBRARY to its absolute path"
        }
        "cuBLAS" => {
            "install CUDA's cuBLAS (the toolkit, or the nvidia-cublas Python wheel), or set \
             UNIRT_CUBLAS_LIBRARY to its absolute path"
        }
        _ => "install it, or name its absolute path in the library's UNIRT_*_LIBRARY variable",
    }
}

/// Every library search of this vendor, for `unirt devices --verbose`: (library, the
/// variable that overrides it, the places searched, the files found).
pub fn searches() -> Vec<(&'static str, &'static str, Search)> {
    vec![
        ("libcuda", CUDA_ENV, find_libcuda()),
        ("NVRTC", NVRTC_ENV, find_nvrtc()),
        ("cuBLAS", CUBLAS_ENV, find_cublas()),
    ]
}

/// Reads an override; `Err` when it is set but not an absolute path.
fn override_path(var: &str) -> Option<Result<PathBuf, String>> {
    let v = std::env::var_os(var)?;
    if v.is_empty() {
        return None;
    }
    let p = PathBuf::from(v);
    Some(if p.is_absolute() {
        Ok(p)
    } else {
        Err(format!(
            "{var}={} is not an absolute path (unirt never loads drivers by relative path)",
            p.display()
        ))
    })
}

fn search_override(var: &str) -> Option<Search> {
    let p = match override_path(var)? {
        Ok(p) => p,
        Err(why) => {
            return Some(Search {
                candidates: Vec::new(),
                searched: vec![why],
            })
        }
    };
    let exists = p.is_file();
    Some(Search {
        searched: vec![format!(
            "{var}={}{}",
            p.display(),
            if exists { "" } else { " (no such file)" }
        )],
        candidates: if exists { vec![p] } else { Vec::new() },
    })
}

/// Absolute directories from a `:`-separated list (relative and empty entries dropped).
fn abs_dirs(list: &str) -> impl Iterator<Item = PathBuf> + '_ {
    list.split(':')
        .filter(|s| s.starts_with('/'))
        .map(PathBuf::from)
}

/// Directories listed in `/etc/ld.so.conf` and the files it includes from `ld.so.conf.d`.
fn ld_so_conf_dirs() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut files = vec![PathBuf::from("/etc/ld.so.conf")];
    if let Ok(rd) = std::fs::read_dir("/etc/ld.so.conf.d") {
        let mut more: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "conf"))
            .collect();
        more.sort();
        files.extend(more);
    }
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.starts_with('/') {
                out.push(PathBuf::from(line));
            }
        }
    }
    out
}

/// The directories the dynamic linker would search, in its order, then the usual ones.
pub fn system_lib_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Ok(v) = std::env::var("LD_LIBRARY_PATH") {
        dirs.extend(abs_dirs(&v));
    }
    dirs.extend(ld_so_conf_dirs());
    for d in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/lib64",
        "/usr/lib",
        "/lib",
        // WSL exposes the Windows driver's libcuda here.
        "/usr/lib/wsl/lib",
    ] {
        dirs.push(PathBuf::from(d));
    }
    dedup(dirs)
}

fn dedup(dirs: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut seen = std::collections::HashSet::new();
    dirs.into_iter()
        .filter(|d| seen.insert(d.clone()))
        .collect()
}

/// The libcuda search: the override alone, else `libcuda.so.1` / `libcuda.so` in the linker's
/// directories. The toolkit's `stubs/` directory is never used: its libcuda only fails.
pub fn find_libcuda() -> Search {
    if let Some(s) = search_override(CUDA_ENV) {
        return s;
    }
    let dirs = system_lib_dirs();
    let mut candidates = Vec::new();
    for d in &dirs {
        for name in ["libcuda.so.1", "libcuda.so"] {
            let p = d.join(name);
            if p.is_file() && !candidates.contains(&p) {
                candidates.push(p);
            }
        }
    }
    Search {
        candidates,
        searched: dirs
            .iter()
            .map(|d| format!("{}/libcuda.so{{.1,}}", d.display()))
            .collect(),
    }
}

/// Parses the numeric suffix of `libnvrtc.so.12.4.127` into `[12, 4, 127]` (`libnvrtc.so` is
/// the empty version, sorted first as the toolkit's own link).
#[cfg(test)]
fn soname_version(name: &str) -> Option<Vec<u32>> {
    soname_version_of(name, "libnvrtc.so")
}

/// `soname_version` (the NVRTC case, used by tests) for any library stem (`libcublas.so`).
fn soname_version_of(name: &str, stem: &str) -> Option<Vec<u32>> {
    let rest = name.strip_prefix(stem)?;
    if rest.is_empty() {
        return Some(Vec::new());
    }
    rest.strip_prefix('.')?
        .split('.')
        .map(|p| p.parse::<u32>().ok())
        .collect()
}

/// Every `libnvrtc.so*` in `dir`, `libnvrtc.so` first, then the highest version first.
#[cfg(test)]
fn nvrtc_in(dir: &Path) -> Vec<PathBuf> {
    lib_in(dir, "libnvrtc.so")
}

/// Every `<stem>*` in `dir`, `<stem>` first, then the highest version first.
fn lib_in(dir: &Path, stem: &str) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(Vec<u32>, PathBuf)> = rd
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let v = soname_version_of(&name, stem)?;
            let p = e.path();
            p.is_file().then_some((v, p))
        })
        .collect();
    found.sort_by(|a, b| match (a.0.is_empty(), b.0.is_empty()) {
        (true, false) => std::cmp::Ordering::Less,
        (false, true) => std::cmp::Ordering::Greater,
        _ => b.0.cmp(&a.0),
    });
    // Several names often lead to one file (libnvrtc.so.12 -> libnvrtc.so.12.4.127): keep
    // each file once, under its shortest name (the soname a person recognises).
    let mut out: Vec<(PathBuf, PathBuf)> = Vec::new();
    for (_, p) in found {
        let real = std::fs::canonicalize(&p).unwrap_or_else(|_| p.clone());
        match out.iter_mut().find(|(r, _)| *r == real) {
            Some((_, shown)) if p.as_os_str().len() < shown.as_os_str().len() => *shown = p,
            Some(_) => {}
            None => out.push((real, p)),
        }
    }
    out.into_iter().map(|(_, p)| p).collect()
}

/// Subdirectories of `dir` whose names start with `prefix`, sorted descending (newest first).
fn subdirs(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    v.sort();
    v.reverse();
    v
}

/// Where Python's `nvidia-*` wheels put a library (`subs` under `site-packages/nvidia`), under
/// every site-packages directory we can name without running Python.
fn python_wheel_dirs(subs: &[&str]) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    let home = std::env::var_os("HOME").map(PathBuf::from);
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(v) = std::env::var_os(var).map(PathBuf::from) {
            if v.is_absolute() {
                roots.push(v.join("lib"));
            }
        }
    }
    if let Some(h) = home.filter(|h| h.is_absolute()) {
        roots.push(h.join(".local/lib"));
    }
    roots.push(PathBuf::from("/usr/local/lib"));
    roots.push(PathBuf::from("/usr/lib"));
    let mut out = Vec::new();
    for root in roots {
        for py in subdirs(&root, "python3") {
            for pk in ["site-packages", "dist-packages"] {
                let nv = py.join(pk).join("nvidia");
                for sub in subs {
                    out.push(nv.join(sub));
                }
            }
        }
    }
    out
}

/// The NVRTC search: the override alone, else CUDA_HOME / CUDA_PATH, /usr/local/cuda (and
/// versioned toolkits), conda, the linker's directories (versioned sonames such as Debian's
/// `libnvrtc.so.11.2`), then Python wheels.
pub fn find_nvrtc() -> Search {
    find_toolkit_lib(
        NVRTC_ENV,
        "libnvrtc.so",
        &["cuda_nvrtc/lib", "cu13/lib", "cu12/lib"],
    )
}

/// The cuBLAS search: the same places as NVRTC (`libcublas.so*`), Python's
/// `nvidia/cublas/lib` wheels included; `UNIRT_CUBLAS_LIBRARY` overrides.
pub fn find_cublas() -> Search {
    find_toolkit_lib(
        CUBLAS_ENV,
        "libcublas.so",
        &["cublas/lib", "cu13/lib", "cu12/lib"],
    )
}

/// A CUDA toolkit library: the override alone, else the toolkit, conda, linker and wheel
/// directories, `<stem>*` in each.
fn find_toolkit_lib(env: &str, stem: &str, wheel_subs: &[&str]) -> Search {
    if let Some(s) = search_override(env) {
        return s;
    }
    let mut toolkits: Vec<PathBuf> = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var).map(PathBuf::from) {
            if v.is_absolute() {
                toolkits.push(v);
            }
        }
    }
    toolkits.push(PathBuf::from("/usr/local/cuda"));
    toolkits.extend(subdirs(Path::new("/usr/local"), "cuda-"));
    let mut dirs = Vec::new();
    for t in toolkits {
        for sub in [
            "lib64",
            "lib",
            "targets/x86_64-linux/lib",
            "targets/sbsa-linux/lib",
        ] {
            dirs.push(t.join(sub));
        }
    }
    if let Some(v) = std::env::var_os("CONDA_PREFIX").map(PathBuf::from) {
        if v.is_absolute() {
            dirs.push(v.join("lib"));
        }
    }
    dirs.extend(system_lib_dirs());
    dirs.extend(python_wheel_dirs(wheel_subs));
    let dirs = dedup(dirs);
    let mut candidates = Vec::new();
    for d in &dirs {
        for p in lib_in(d, stem) {
            if !candidates.contains(&p) {
                candidates.push(p);
            }
        }
    }
    Search {
        candidates,
        searched: dirs
            .iter()
            .filter(|d| d.is_dir())
            .map(|d| format!("{}/{stem}*", d.display()))
            .chain(std::iter::once(
                "CUDA_HOME, CUDA_PATH, /usr/local/cuda*, python nvidia wheels (absent)".into(),
            ))
            .collect(),
    }
}

/// Opens the first candidate that loads; the error lists the search and every load failure.
pub fn open_first(what: &str, s: &Search) -> Result<(libloading::Library, PathBuf), String> {
    let mut failures = Vec::new();
    for p in &s.candidates {
        // SAFETY: loading a shared library runs its initialisers. The path is absolute and was
        // found where this vendor's driver is installed (or named by the user's override);
        // libcuda's and NVRTC's initialisers are the vendor's and have no preconditions.
        match unsafe { libloading::Library::new(p) } {
            Ok(lib) => return Ok((lib, p.clone())),
            Err(e) => failures.push(format!("{}: {e}", p.display())),
        }
    }
    if failures.is_empty() {
        Err(format!(
            "{what} not found ({}): {}",
            s.describe(),
            fix_for(what)
        ))
    } else {
        Err(format!(
            "{what} found but failed to load ({}; {})",
            failures.join("; "),
            s.describe()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_is_one_line_with_the_count_and_a_fix() {
        let s = Search {
            candidates: Vec::new(),
            searched: vec!["/a/libcuda.so".into(), "/b/libcuda.so".into(), "/c".into()],
        };
        let Err(why) = open_first("libcuda", &s) else {
            panic!("nothing to open, yet it opened");
        };
        assert_eq!(
            why,
            "libcuda not found (searched 3 places; `unirt devices --verbose` lists them): \
             install the NVIDIA driver, or set UNIRT_CUDA_LIBRARY to libcuda's absolute path"
        );
        assert!(!why.contains('\n'));
        // One place (an override) is named as it is.
        let one = Search {
            candidates: Vec::new(),
            searched: vec!["UNIRT_NVRTC_LIBRARY=/x (no such file)".into()],
        };
        assert!(open_first("NVRTC", &one)
            .err()
            .is_some_and(|w| w.starts_with("NVRTC not found (searched UNIRT_NVRTC_LIBRARY=/x")));
    }

    #[cfg(unix)]
    #[test]
    fn soname_versions_sort_newest_first() {
        assert_eq!(soname_version("libnvrtc.so"), Some(vec![]));
        assert_eq!(soname_version("libnvrtc.so.11.2"), Some(vec![11, 2]));
        assert_eq!(soname_version("libnvrtc-builtins.so.11.8"), None);
        assert_eq!(soname_version("libnvrtc.so.alt"), None);
        let dir = std::env::temp_dir().join(format!("unirt-loader-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for n in [
            "libnvrtc.so.11.2",
            "libnvrtc.so.12.4.127",
            "libnvrtc-builtins.so.12",
        ] {
            std::fs::write(dir.join(n), n).unwrap();
        }
        std::os::unix::fs::symlink("libnvrtc.so.12.4.127", dir.join("libnvrtc.so.12")).unwrap();
        let names: Vec<String> = nvrtc_in(&dir)
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["libnvrtc.so.12", "libnvrtc.so.11.2"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn relative_paths_are_never_searched() {
        assert!(abs_dirs("lib::/usr/lib:.").eq([PathBuf::from("/usr/lib")]));
    }
}
