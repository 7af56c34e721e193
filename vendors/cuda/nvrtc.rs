//! NVRTC, the CUDA C compiler library, through our own symbols.
//!
//! cudarc's NVRTC loader cannot be pointed at a path and panics when its name list misses the
//! installed soname (Debian ships `libnvrtc.so.11.2`), so the library is found by
//! [`super::loader::find_nvrtc`] and the few entry points unirt needs are
//! declared here. Results are plain `i32` for the same reason as in `driver.rs`. NVRTC runs on
//! the host: compiling needs no GPU and no libcuda.
//!
//! **Process exit.** NVRTC's C++ statics are destroyed by handlers `exit` runs whether or not
//! another thread is compiling: a program whose `main` returned while a worker thread compiled
//! its first kernels died with SIGSEGV inside `nvrtcCompileProgram` (3 of 12 runs of a scratch
//! program over the fake driver here). Every call into NVRTC passes its gate
//! (`exit::NVRTC_GATE`); the exit hook ([`crate::exit`], run before NVRTC's handlers) closes
//! it and waits for the compiles in progress, at most [`EXIT_WAIT`]; a compile that starts
//! later fails with `Error::Unavailable` ("the process is exiting"). Checked by
//! `tests/exit_race.rs`.

use std::ffi::{c_char, c_int, CStr, CString};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use libloading::Library;

use super::loader;
use crate::device::DeviceKind;
use crate::error::{Error, Result};
// Passed by every call into NVRTC; closed by the exit hook.
use crate::exit::{GatePass, NVRTC_GATE as GATE};

type NvrtcResult = i32;
type Program = *mut std::ffi::c_void;
const NVRTC_SUCCESS: NvrtcResult = 0;

/// The most architectures, log bytes and output bytes unirt believes of NVRTC: a larger
/// answer is a broken library, never a reason to allocate (far above any real NVRTC: tens of
/// architectures, kilobytes of log, megabytes of PTX/CUBIN).
const MAX_ARCHS: usize = 1024;
const MAX_LOG: usize = 64 << 20;
const MAX_OUTPUT: usize = 1 << 30;

/// How long an exit waits for the compiles in progress (a large kernel takes a few seconds on
/// a busy machine).
const EXIT_WAIT: Duration = Duration::from_secs(20);

/// Enters a call into NVRTC (see the module docs), or refuses it once the process is exiting.
fn in_use() -> Result<GatePass<'static>> {
    crate::exit::note_thread();
    GATE.enter().ok_or_else(|| Error::Unavailable {
        backend: DeviceKind::Cuda,
        reason: "NVRTC: the process is exiting".into(),
    })
}

/// The exit hook: no compile starts after it, and those in progress end first.
fn close_at_exit() {
    GATE.close(EXIT_WAIT);
}

/// `n` zeroed elements, or None when NVRTC's `n` is past `max` or the host cannot hold it.
fn zeroed<T: Clone + Default>(n: usize, max: usize) -> Option<Vec<T>> {
    if n > max {
        return None;
    }
    let mut v = Vec::new();
    v.try_reserve_exact(n).ok()?;
    v.resize(n, T::default());
    Some(v)
}

macro_rules! nvrtc_api {
    (required { $($name:ident($($ty:ty),*);)* } optional { $($oname:ident($($oty:ty),*);)* }) => {
        #[allow(non_snake_case)]
        struct Api {
            $( $name: unsafe extern "C" fn($($ty),*) -> NvrtcResult, )*
            $( $oname: Option<unsafe extern "C" fn($($oty),*) -> NvrtcResult>, )*
            nvrtcGetErrorString: unsafe extern "C" fn(NvrtcResult) -> *const c_char,
        }

        impl Api {
            fn load(lib: &Library) -> std::result::Result<Api, String> {
                // SAFETY (all `get`s below): each declared type is nvrtc.h's prototype for the
                // symbol; pointers are used only while the 'static `Library` lives.
                Ok(Api {
                    $( $name: *unsafe {
                        lib.get::<unsafe extern "C" fn($($ty),*) -> NvrtcResult>(
                            concat!(stringify!($name), "\0").as_bytes())
                    }.map_err(|e| format!("it lacks {} ({e})", stringify!($name)))?, )*
                    $( $oname: unsafe {
                        lib.get::<unsafe extern "C" fn($($oty),*) -> NvrtcResult>(
                            concat!(stringify!($oname), "\0").as_bytes())
                    }.ok().map(|s| *s), )*
                    nvrtcGetErrorString: *unsafe {
                        lib.get::<unsafe extern "C" fn(NvrtcResult) -> *const c_char>(
                            b"nvrtcGetErrorString\0")
                    }.map_err(|e| format!("it lacks nvrtcGetErrorString ({e})"))?,
                })
            }
        }
    };
}

nvrtc_api! {
    required {
        nvrtcVersion(*mut c_int, *mut c_int);
        nvrtcCreateProgram(*mut Program, *const c_char, *const c_char, c_int, *const *const c_char, *const *const c_char);
        nvrtcCompileProgram(Program, c_int, *const *const c_char);
        nvrtcGetProgramLogSize(Program, *mut usize);
        nvrtcGetProgramLog(Program, *mut c_char);
        nvrtcGetPTXSize(Program, *mut usize);
        nvrtcGetPTX(Program, *mut c_char);
        nvrtcDestroyProgram(*mut Program);
    }
    optional {
        nvrtcGetCUBINSize(Program, *mut usize);
        nvrtcGetCUBIN(Program, *mut c_char);
        nvrtcGetNumSupportedArchs(*mut c_int);
        nvrtcGetSupportedArchs(*mut c_int);
    }
}

/// The loaded NVRTC.
pub struct Nvrtc {
    api: Api,
    /// Where it was loaded from.
    pub path: PathBuf,
    /// (major, minor), e.g. (11, 8).
    pub version: (i32, i32),
    _lib: Library,
}

/// What to compile to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// Machine code for exactly `sm_XY` (XY = 10 × major + minor).
    Cubin(u32),
    /// PTX for `compute_XY`, which the driver JIT-compiles for newer devices.
    Ptx(u32),
}

impl Target {
    /// `sm_80` / `compute_80`.
    pub fn arch(self) -> String {
        match self {
            Target::Cubin(a) => format!("sm_{a}"),
            Target::Ptx(a) => format!("compute_{a}"),
        }
    }
}

/// The process's NVRTC, loaded once; `Err` is the reason it is unusable.
pub fn nvrtc() -> std::result::Result<&'static Nvrtc, String> {
    static NVRTC: OnceLock<std::result::Result<Nvrtc, String>> = OnceLock::new();
    NVRTC.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// [`nvrtc`] as a unirt error.
pub fn require() -> Result<&'static Nvrtc> {
    nvrtc().map_err(|reason| Error::Unavailable {
        backend: DeviceKind::Cuda,
        reason,
    })
}

fn load() -> std::result::Result<Nvrtc, String> {
    let search = loader::find_nvrtc();
    let (lib, path) = loader::open_first("NVRTC", &search)?;
    let api =
        Api::load(&lib).map_err(|e| format!("NVRTC at {} is unusable: {e}", path.display()))?;
    // NVRTC registered its exit handlers as it loaded: the hook is armed to run before them.
    crate::exit::register(close_at_exit);
    let _in_use = in_use().map_err(|e| e.to_string())?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two ints through valid pointers.
    let r = unsafe { (api.nvrtcVersion)(&mut major, &mut minor) };
    if r != NVRTC_SUCCESS {
        return Err(format!(
            "NVRTC at {} failed nvrtcVersion ({r})",
            path.display()
        ));
    }
    Ok(Nvrtc {
        api,
        path,
        version: (major, minor),
        _lib: lib,
    })
}

/// Frees the program on every path out of [`Nvrtc::compile`].
struct ProgramGuard<'a>(&'a Api, Program);

impl Drop for ProgramGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is destroyed once, here.
        unsafe { (self.0.nvrtcDestroyProgram)(&mut self.1) };
    }
}

impl Nvrtc {
    /// "11.8".
    pub fn version_string(&self) -> String {
        format!("{}.{}", self.version.0, self.version.1)
    }

    fn describe(&self, r: NvrtcResult) -> String {
        // SAFETY: returns a static string for any code (an "unknown" text for unknown ones).
        let p = unsafe { (self.api.nvrtcGetErrorString)(r) };
        if p.is_null() {
            return format!("nvrtcResult {r}");
        }
        // SAFETY: non-null and NUL-terminated (static storage in the library).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    fn fail(&self, r: NvrtcResult, call: &str) -> Error {
        Error::Driver {
            backend: DeviceKind::Cuda,
            call: call.into(),
            code: Some(r),
            message: self.describe(r),
        }
    }

    /// The real architectures (`sm_XY` as XY) this NVRTC can produce CUBIN for, when it can
    /// say (NVRTC 11.2+).
    pub fn supported_archs(&self) -> Option<Vec<u32>> {
        let (num, get) = (
            self.api.nvrtcGetNumSupportedArchs?,
            self.api.nvrtcGetSupportedArchs?,
        );
        let _in_use = in_use().ok()?;
        let mut n: c_int = 0;
        // SAFETY: writes one int.
        if unsafe { num(&mut n) } != NVRTC_SUCCESS || n <= 0 {
            return None;
        }
        let mut v: Vec<c_int> = zeroed(usize::try_from(n).ok()?, MAX_ARCHS)?;
        // SAFETY: the buffer holds exactly the number of entries NVRTC just reported.
        if unsafe { get(v.as_mut_ptr()) } != NVRTC_SUCCESS {
            return None;
        }
        Some(v.into_iter().map(|a| a.max(0) as u32).collect())
    }

    /// The best target for a device of compute capability `cc` (XY): its own CUBIN when this
    /// NVRTC knows the architecture, else PTX for the newest one it knows below it (the driver
    /// then compiles that PTX for the device).
    pub fn target_for(&self, cc: u32) -> Target {
        match self.supported_archs() {
            Some(archs) if archs.contains(&cc) && self.api.nvrtcGetCUBIN.is_some() => {
                Target::Cubin(cc)
            }
            Some(archs) => Target::Ptx(archs.into_iter().filter(|&a| a <= cc).max().unwrap_or(cc)),
            None => Target::Ptx(cc),
        }
    }

    /// Compiles `source` (the file `name`) for `target`. A compile error is
    /// [`Error::KernelCompile`] with NVRTC's log; `Ok` carries the image and the log (warnings).
    pub fn compile(&self, name: &str, source: &str, target: Target) -> Result<(Vec<u8>, String)> {
        // A C++ compiler recurses deeply: on a thread with room on its stack where the
        // caller's has little (a C program's small thread reaching its first memset).
        crate::host_threads::on_roomy_stack(|| self.compile_here(name, source, target))
            .unwrap_or_else(|| {
                Err(Error::Internal(format!(
                    "{name}: cannot start a thread with room on its stack to compile it"
                )))
            })
    }

    fn compile_here(&self, name: &str, source: &str, target: Target) -> Result<(Vec<u8>, String)> {
        // Declared first: released after the program is destroyed.
        let _in_use = in_use()?;
        let csrc = CString::new(source)
            .map_err(|_| Error::BadParam(format!("kernel source {name} contains NUL")))?;
        let cname = CString::new(name)
            .map_err(|_| Error::BadParam(format!("kernel name {name:?} contains NUL")))?;
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: source and name are NUL-terminated and outlive the call; no headers.
        let r = unsafe {
            (self.api.nvrtcCreateProgram)(
                &mut prog,
                csrc.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if r != NVRTC_SUCCESS {
            return Err(self.fail(r, "nvrtcCreateProgram"));
        }
        let guard = ProgramGuard(&self.api, prog);
        let opts: Vec<CString> = [
            format!("--gpu-architecture={}", target.arch()),
            "--std=c++14".into(),
        ]
        .into_iter()
        .filter_map(|o| CString::new(o).ok())
        .collect();
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        // SAFETY: prog is live (guard); the options are NUL-terminated and outlive the call.
        let r = unsafe {
            (self.api.nvrtcCompileProgram)(guard.1, opt_ptrs.len() as c_int, opt_ptrs.as_ptr())
        };
        let log = self.log(guard.1);
        if r != NVRTC_SUCCESS {
            return Err(Error::KernelCompile {
                kernel: format!("{name} ({})", target.arch()),
                log: format!("{}: {}", self.describe(r), log.trim()),
            });
        }
        let image = match target {
            Target::Cubin(_) => match (self.api.nvrtcGetCUBINSize, self.api.nvrtcGetCUBIN) {
                (Some(size), Some(get)) => self.output(guard.1, size, get, "nvrtcGetCUBIN")?,
                _ => {
                    return Err(Error::unsupported(
                        format!("CUBIN output (NVRTC {})", self.version_string()),
                        DeviceKind::Cuda,
                    ))
                }
            },
            Target::Ptx(_) => self.output(
                guard.1,
                self.api.nvrtcGetPTXSize,
                self.api.nvrtcGetPTX,
                "nvrtcGetPTX",
            )?,
        };
        Ok((image, log))
    }

    fn log(&self, prog: Program) -> String {
        let mut n = 0usize;
        // SAFETY: prog is live; writes one size_t.
        if unsafe { (self.api.nvrtcGetProgramLogSize)(prog, &mut n) } != NVRTC_SUCCESS || n == 0 {
            return String::new();
        }
        let Some(mut buf) = zeroed::<u8>(n, MAX_LOG) else {
            return format!("(NVRTC reported a log of {n} bytes; not read)");
        };
        // SAFETY: the buffer has the size NVRTC just reported (including the NUL).
        if unsafe { (self.api.nvrtcGetProgramLog)(prog, buf.as_mut_ptr() as *mut c_char) }
            != NVRTC_SUCCESS
        {
            return String::new();
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    }

    fn output(
        &self,
        prog: Program,
        size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
        get: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
        call: &str,
    ) -> Result<Vec<u8>> {
        let mut n = 0usize;
        // SAFETY: prog is live and compiled; writes one size_t.
        let r = unsafe { size(prog, &mut n) };
        if r != NVRTC_SUCCESS {
            return Err(self.fail(r, call));
        }
        let mut buf = zeroed::<u8>(n, MAX_OUTPUT).ok_or_else(|| Error::Driver {
            backend: DeviceKind::Cuda,
            call: call.into(),
            code: None,
            message: format!(
                "reported an output of {n} bytes, more than unirt accepts ({MAX_OUTPUT})"
            ),
        })?;
        // SAFETY: the buffer has exactly the size NVRTC reported for this output.
        let r = unsafe { get(prog, buf.as_mut_ptr() as *mut c_char) };
        if r != NVRTC_SUCCESS {
            return Err(self.fail(r, call));
        }
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device newer than NVRTC gets PTX for the newest architecture NVRTC knows (the driver
    /// JIT-compiles it); a known one gets its own CUBIN.
    #[test]
    fn targets_follow_what_nvrtc_supports() {
        let Ok(nv) = nvrtc() else {
            eprintln!("skipped: NVRTC not found");
            return;
        };
        let archs = nv
            .supported_archs()
            .expect("NVRTC 11.2+ lists its architectures");
        let newest = *archs.iter().max().unwrap();
        assert!(archs.contains(&80), "{archs:?}");
        assert_eq!(nv.target_for(80), Target::Cubin(80));
        assert_eq!(nv.target_for(newest + 10), Target::Ptx(newest));
        assert_eq!(Target::Ptx(90).arch(), "compute_90");
        let (ptx, _) = nv
            .compile(
                "elementwise.cu",
                super::super::kernels::SOURCES[0].source,
                Target::Ptx(newest),
            )
            .unwrap();
        let text = String::from_utf8_lossy(&ptx);
        assert!(text.contains(".entry fill"), "{text}");
    }
}
