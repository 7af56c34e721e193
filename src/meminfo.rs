//! How much memory the host has, and how much it can back now: `/proc/meminfo`, bounded by the
//! memory limit of the process's cgroup (v2 or v1) where one is set.
//!
//! Why unirt asks: Linux overcommits. An allocation of more than the host can back usually
//! succeeds and kills the process later, when its pages are first touched (the OOM killer —
//! the cgroup's inside a container, where `/proc/meminfo` shows the whole machine). A GPU
//! refuses such an allocation at once; the CPU backend, the wgpu adapters that keep buffers in
//! host memory and unirt's own host vectors refuse it through [`check_backable`] instead, so
//! the caller gets [`Error::OutOfMemory`](crate::Error::OutOfMemory) rather than a `SIGKILL`.
//! The answer is an estimate taken at that moment (other processes and threads allocate too):
//! it stops the request that can never fit, not every pressure the system may come under.
//!
//! Memory granted but not yet touched is invisible to `/proc/meminfo` and to the cgroup: a
//! process that allocates 800 MB three times in a 2 GB cgroup, a second apart, and only then
//! fills the buffers would be told three times that 1.9 GB are free, and killed at the third
//! fill. So unirt keeps a ledger of its own live host allocations from [`CHECK_FROM`] up
//! ([`HostGrant`]); what of it the process has not yet made resident (at least the ledger less
//! the process's resident anonymous and shared memory and its swap, from `/proc/self/status`)
//! is taken off what the host can back. The bound errs towards lending: memory the process
//! touched for other reasons hides as much of the ledger.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Allocations below this size are not checked (a read of `/proc/meminfo` and of the cgroup's
/// files costs tens of microseconds; faulting in 64 MiB costs milliseconds).
pub const CHECK_FROM: u64 = 64 << 20;

/// The host's memory as this process sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostMemory {
    /// RAM (`MemTotal`), or the cgroup's limit where that is lower.
    pub total: u64,
    /// What can be backed now without killing anything: `MemAvailable` (free memory plus the
    /// caches the kernel can drop) and free swap — or the cgroup's headroom (its limit less
    /// its usage, with inactive file pages counted as free) plus free swap, where lower.
    pub available: u64,
}

/// Reads the host's memory now; `None` where `/proc/meminfo` cannot be read.
pub fn host_memory() -> Option<HostMemory> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let m = parse_meminfo(&text)?;
    let swap_free = m.swap_free;
    let mut host = HostMemory {
        total: m.total,
        available: m.available.saturating_add(swap_free),
    };
    if let Some(cg) = cgroup_memory() {
        host.total = host.total.min(cg.limit);
        host.available = host.available.min(cg.headroom().saturating_add(swap_free));
    }
    host.available = host.available.saturating_sub(granted_untouched());
    Some(host)
}

/// Bytes of live host allocations of at least [`CHECK_FROM`] that unirt has granted (see the
/// module docs): the CPU backend's device memory, pinned host memory, and the buffers of wgpu
/// adapters that keep them in host memory.
static GRANTED: AtomicU64 = AtomicU64::new(0);

/// Records a live host allocation of `bytes` (ignored below [`CHECK_FROM`]); pair it with
/// [`note_released`] of the same size, or hold a [`HostGrant`] instead.
pub fn note_granted(bytes: u64) {
    if bytes >= CHECK_FROM {
        GRANTED.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// Ends a record of [`note_granted`].
pub fn note_released(bytes: u64) {
    if bytes >= CHECK_FROM {
        // Saturating: a release without its grant must not wrap the ledger.
        let _ = GRANTED.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |g| {
            Some(g.saturating_sub(bytes))
        });
    }
}

/// A live host allocation in the ledger for as long as it is held ([`note_granted`] on
/// creation, [`note_released`] on drop).
#[derive(Debug)]
pub struct HostGrant {
    bytes: u64,
}

impl HostGrant {
    pub fn new(bytes: u64) -> Self {
        note_granted(bytes);
        HostGrant { bytes }
    }
}

impl Drop for HostGrant {
    fn drop(&mut self) {
        note_released(self.bytes);
    }
}

/// A lower bound on the ledger's bytes that no page backs yet: the ledger less what the
/// process holds resident or swapped (0 where that cannot be read).
fn granted_untouched() -> u64 {
    let granted = GRANTED.load(Ordering::Relaxed);
    if granted == 0 {
        return 0;
    }
    let held = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|t| parse_status_held(&t));
    held.map_or(0, |h| granted.saturating_sub(h))
}

/// The value of a `Name:  123 kB` line of a `/proc` file, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .map(|kib| kib.saturating_mul(1024))
}

/// The memory a process holds that its allocations may have made resident, from
/// `/proc/self/status`: anonymous and shared resident pages and swapped-out pages, in bytes.
fn parse_status_held(text: &str) -> Option<u64> {
    let field = |name: &str| kib_field(text, name);
    // RssAnon appeared in Linux 4.5; without it the bound is not taken.
    let anon = field("RssAnon:")?;
    let shmem = field("RssShmem:").unwrap_or(0);
    let swap = field("VmSwap:").unwrap_or(0);
    Some(anon.saturating_add(shmem).saturating_add(swap))
}

/// All the memory this machine has (RAM and swap, from `/proc/meminfo`), read once;
/// `u64::MAX` where it cannot be read. No allocation larger than this can ever be backed.
pub fn machine_memory() -> u64 {
    static TOTAL: OnceLock<u64> = OnceLock::new();
    *TOTAL.get_or_init(|| {
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|t| parse_meminfo(&t))
            .map_or(u64::MAX, |m| m.total.saturating_add(m.swap_total))
    })
}

/// `Err` with the reason, in words, where an allocation of `size` bytes of host memory cannot
/// be backed now (see the module docs). Below [`CHECK_FROM`] only the machine's RAM and swap
/// bound it; where nothing can be read (another OS), nothing does.
pub fn check_backable(size: u64) -> Result<(), String> {
    let total = machine_memory();
    if size > total {
        return Err(format!(
            "more than all of this machine's memory ({total} bytes of RAM and swap)"
        ));
    }
    if size < CHECK_FROM {
        return Ok(());
    }
    // A reading younger than a second that leaves room for twice this allocation answers
    // without reading the files again (they cost ~15 µs, a raw 64 MiB allocation ~5 µs); what
    // it let through is taken off it, and frees are not added back, so it only errs towards
    // reading again.
    let mut last = LAST_READING.lock();
    if let Some((at, room)) = *last {
        if at.elapsed() < READING_LIFETIME && size <= room / 2 {
            *last = Some((at, room - size));
            return Ok(());
        }
    }
    match host_memory() {
        Some(m) if size > m.available => {
            *last = None;
            Err(format!(
                "more than the host can back now ({} bytes available of {})",
                m.available, m.total
            ))
        }
        Some(m) => {
            *last = Some((Instant::now(), m.available - size));
            Ok(())
        }
        None => Ok(()),
    }
}

/// How long a reading of the host's memory answers [`check_backable`].
const READING_LIFETIME: Duration = Duration::from_secs(1);

/// The last reading's time, and the room it left after the allocations it has let through.
static LAST_READING: Mutex<Option<(Instant, u64)>> = Mutex::new(None);

/// The fields of `/proc/meminfo` that matter here, in bytes.
#[derive(Debug, PartialEq, Eq)]
struct Meminfo {
    total: u64,
    available: u64,
    swap_total: u64,
    swap_free: u64,
}

fn parse_meminfo(text: &str) -> Option<Meminfo> {
    let field = |name: &str| kib_field(text, name);
    Some(Meminfo {
        total: field("MemTotal:")?,
        // Kernels before 3.14 have no MemAvailable; free memory is the lower bound.
        available: field("MemAvailable:").or_else(|| field("MemFree:"))?,
        swap_total: field("SwapTotal:").unwrap_or(0),
        swap_free: field("SwapFree:").unwrap_or(0),
    })
}

/// A cgroup's memory limit and use, in bytes.
#[derive(Debug, PartialEq, Eq)]
struct CgroupMemory {
    limit: u64,
    usage: u64,
    inactive_file: u64,
}

impl CgroupMemory {
    fn headroom(&self) -> u64 {
        self.limit
            .saturating_sub(self.usage)
            .saturating_add(self.inactive_file.min(self.usage))
    }
}

/// Limits at or above this are "no limit" (cgroup v1 writes one just below `i64::MAX`).
const NO_LIMIT: u64 = 1 << 62;

/// Where this process's cgroup keeps its memory files: the directory, the files' names
/// (limit, usage, statistics) and the statistics' key for inactive file pages.
struct CgroupFiles {
    dir: PathBuf,
    files: [&'static str; 3],
    inactive_key: &'static str,
}

/// The memory limit of this process's cgroup, where one is set and readable. Where the files
/// lie is found once (a process stays in its cgroup); the figures are read each time.
fn cgroup_memory() -> Option<CgroupMemory> {
    static FILES: OnceLock<Option<CgroupFiles>> = OnceLock::new();
    let f = FILES.get_or_init(find_cgroup).as_ref()?;
    read_cgroup(&f.dir, f.files, f.inactive_key)
}

fn find_cgroup() -> Option<CgroupFiles> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let root = Path::new("/sys/fs/cgroup");
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let path = path.trim_start_matches('/');
        let (dirs, files, inactive_key) = if id == "0" && controllers.is_empty() {
            // cgroup v2: one hierarchy. Inside a cgroup namespace the path may not exist under
            // /sys/fs/cgroup, whose root is then the process's own cgroup.
            let files = ["memory.max", "memory.current", "memory.stat"];
            (
                [root.join(path), root.to_path_buf()],
                files,
                "inactive_file",
            )
        } else if controllers.split(',').any(|c| c == "memory") {
            let v1 = root.join("memory");
            let files = [
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                "memory.stat",
            ];
            ([v1.join(path), v1], files, "total_inactive_file")
        } else {
            continue;
        };
        if let Some(dir) = dirs.into_iter().find(|d| d.join(files[0]).is_file()) {
            return Some(CgroupFiles {
                dir,
                files,
                inactive_key,
            });
        }
    }
    None
}

/// Reads `[limit, usage, stat]` from `dir`; `None` without a limit.
fn read_cgroup(dir: &Path, files: [&str; 3], inactive_key: &str) -> Option<CgroupMemory> {
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
    let limit_text = read(files[0])?;
    let limit = limit_text.trim().parse::<u64>().ok()?; // "max" (v2) is no limit
    if limit >= NO_LIMIT {
        return None;
    }
    let usage = read(files[1])?.trim().parse::<u64>().ok()?;
    let inactive_file = read(files[2])
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix(inactive_key)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse()
                    .ok()
            })
        })
        .unwrap_or(0);
    Some(CgroupMemory {
        limit,
        usage,
        inactive_file,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields_in_bytes() {
        let text = "MemTotal:       24683584 kB\nMemFree:         1000 kB\n\
                    MemAvailable:   11095080 kB\nSwapTotal:  2048 kB\nSwapFree: 1024 kB\n";
        assert_eq!(
            parse_meminfo(text),
            Some(Meminfo {
                total: 24683584 * 1024,
                available: 11095080 * 1024,
                swap_total: 2048 * 1024,
                swap_free: 1024 * 1024,
            })
        );
        // An old kernel: no MemAvailable, no swap lines.
        let old = parse_meminfo("MemTotal: 8 kB\nMemFree: 4 kB\n").unwrap();
        assert_eq!((old.available, old.swap_free), (4096, 0));
        assert_eq!(parse_meminfo("MemFree: 4 kB\n"), None);
    }

    #[test]
    fn cgroup_headroom_counts_inactive_file_pages_as_free() {
        let dir = std::env::temp_dir().join(format!("unirt-cgroup-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = ["memory.max", "memory.current", "memory.stat"];
        std::fs::write(dir.join(files[0]), "1000000\n").unwrap();
        std::fs::write(dir.join(files[1]), "600000\n").unwrap();
        std::fs::write(dir.join(files[2]), "anon 500000\ninactive_file 100000\n").unwrap();
        let m = read_cgroup(&dir, files, "inactive_file").unwrap();
        assert_eq!(m.headroom(), 500_000);
        std::fs::write(dir.join(files[0]), "max\n").unwrap();
        assert_eq!(read_cgroup(&dir, files, "inactive_file"), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn status_fields_held_in_bytes() {
        let text = "VmRSS:\t 5000 kB\nRssAnon:\t 3000 kB\nRssFile:\t 1500 kB\n\
                    RssShmem:\t 500 kB\nVmSwap:\t 100 kB\n";
        assert_eq!(parse_status_held(text), Some(3600 * 1024));
        assert_eq!(parse_status_held("VmRSS: 5000 kB\n"), None);
    }

    #[test]
    fn refuses_only_what_cannot_be_backed() {
        assert!(check_backable(CHECK_FROM - 1).is_ok());
        assert!(check_backable(u64::MAX).is_err());
        if let Some(m) = host_memory() {
            assert!(m.available <= m.total.saturating_add(machine_memory()));
            let over = m.available.saturating_add(m.total / 2).max(CHECK_FROM);
            assert!(check_backable(over).is_err(), "{over} bytes of {m:?}");
        }
    }
}
