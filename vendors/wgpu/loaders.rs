//! What wgpu may load: its Vulkan and GL loaders are not started through a search path that
//! reaches the current directory.
//!
//! wgpu opens `libvulkan.so.1` and `libEGL.so.1` (then `libEGL.so`) by bare name; the Vulkan
//! loader then opens its driver, and libglvnd its vendor library (`libEGL_mesa.so.0`, again by
//! bare name), and each of those pulls in its own dependencies (LLVM, libdrm, libxcb, …). The
//! dynamic linker looks every one of them up in `LD_LIBRARY_PATH` first, where an empty entry
//! (`::`, a leading or trailing `:`), `.` or any relative entry means the current directory —
//! so a library planted there would run its constructor inside the process (issue 17).
//!
//! Loading the two loaders ourselves from absolute paths first would not be enough: their
//! drivers' dependencies are still looked up through the same search path. So when
//! `LD_LIBRARY_PATH` has such an entry, unirt does not start wgpu's Vulkan and GL backends and
//! says why; `UNIRT_TRUST_LD_LIBRARY_PATH=1` starts them anyway for a caller who means it.

/// The entries of a search path that resolve against the current directory, described.
pub(crate) fn untrusted_entries(search_path: &str) -> Vec<String> {
    if search_path.is_empty() {
        // An empty LD_LIBRARY_PATH is no search path at all (glibc ignores it).
        return Vec::new();
    }
    let mut found: Vec<String> = Vec::new();
    for e in search_path.split(':').filter(|e| !e.starts_with('/')) {
        let described = if e.is_empty() {
            "an empty entry".to_string()
        } else {
            format!("the relative entry {e:?}")
        };
        if !found.contains(&described) {
            found.push(described);
        }
    }
    found
}

/// Removes from `backends` the ones that load libraries by bare name (Vulkan, GL) when
/// `LD_LIBRARY_PATH` reaches the current directory; returns why, if it removed any.
pub(crate) fn secure(backends: &mut wgpu::Backends) -> Option<String> {
    let dlopened = wgpu::Backends::VULKAN | wgpu::Backends::GL;
    if !backends.intersects(dlopened) {
        return None;
    }
    let search_path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let untrusted = untrusted_entries(&search_path);
    if untrusted.is_empty() || std::env::var("UNIRT_TRUST_LD_LIBRARY_PATH").is_ok_and(|v| v == "1")
    {
        return None;
    }
    backends.remove(dlopened);
    Some(format!(
        "wgpu's Vulkan and GL loaders were not started: LD_LIBRARY_PATH={search_path:?} has {}, \
         which makes the dynamic linker look for libvulkan.so.1, libEGL.so.1 and their drivers' \
         libraries in the current directory first; remove those entries (or set \
         UNIRT_TRUST_LD_LIBRARY_PATH=1 to load through them anyway)",
        untrusted.join(" and ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_and_empty_entries_are_untrusted() {
        assert!(untrusted_entries("").is_empty());
        assert!(untrusted_entries("/usr/lib:/opt/x/lib").is_empty());
        assert_eq!(untrusted_entries(":/usr/lib").len(), 1);
        assert_eq!(untrusted_entries("/usr/lib:").len(), 1);
        assert_eq!(untrusted_entries("/a::/b").len(), 1);
        assert_eq!(untrusted_entries(".").len(), 1);
        assert_eq!(untrusted_entries("lib:/usr/lib:x").len(), 2);
        assert_eq!(untrusted_entries(":").len(), 1);
    }
}
