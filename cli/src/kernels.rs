//! `unirt kernels --list [--json FILE]`: the operator kernel registry as an op × backend ×
//! dtype table (JSON: `[{"op", "backend", "dtype"}, …]`).
//!
//! `unirt kernels --compile cuda --arch sm_70,sm_80,sm_90 [--json FILE]`: compiles every CUDA
//! kernel to CUBIN with NVRTC. No GPU and no libcuda are needed, so CI checks the kernel
//! sources on any machine with NVRTC. Exit status 1 when any kernel fails to compile.

use std::path::Path;
use std::process::ExitCode;

use serde::Serialize;
use unirt::vendors::cuda;

use crate::CliResult;

/// One registered kernel, as `--list --json` writes it.
#[derive(Serialize)]
struct KernelRow {
    op: String,
    backend: &'static str,
    dtype: &'static str,
}

/// Prints the registry: one line per operator, the dtypes each backend registers.
pub fn list(json: Option<&Path>) -> CliResult<ExitCode> {
    use std::collections::BTreeMap;
    use unirt::DeviceKind;
    let rows: Vec<KernelRow> = unirt::ops::kernels()
        .into_iter()
        .filter(|(_, _, builtin)| *builtin)
        .map(|(k, _, _)| KernelRow {
            op: k.op,
            backend: k.device.as_str(),
            dtype: k.dtype.name(),
        })
        .collect();
    let mut table: BTreeMap<&str, BTreeMap<&str, Vec<&str>>> = BTreeMap::new();
    for r in &rows {
        table
            .entry(&r.op)
            .or_default()
            .entry(r.backend)
            .or_default()
            .push(r.dtype);
    }
    let kinds = DeviceKind::ALL;
    // The first column as wide as the longest operator's name (`fused_elementwise`, 17).
    let w = table.keys().map(|op| op.len()).max().unwrap_or(2);
    print!("{:<w$}", "op");
    for k in kinds {
        print!(" {:<34}", k.as_str());
    }
    println!();
    for (op, per) in &table {
        print!("{op:<w$}");
        for k in kinds {
            let cell = per.get(k.as_str()).map_or("-".to_string(), |d| d.join(" "));
            print!(" {cell:<34}");
        }
        println!();
    }
    println!(
        "{} kernels, {} operators (a '-' is Error::UnsupportedKernel on that backend)",
        rows.len(),
        table.len()
    );
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)?;
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run(compile: &str, arch: &str, json: Option<&Path>) -> CliResult<ExitCode> {
    if !compile.eq_ignore_ascii_case("cuda") {
        return Err(
            format!("--compile {compile}: only cuda kernels are compiled ahead of time").into(),
        );
    }
    let archs = cuda::parse_archs(arch)?;
    if archs.is_empty() {
        return Err("--arch needs at least one architecture (sm_70,sm_80,…)".into());
    }
    let build = cuda::compile_kernels(&archs)?;
    println!(
        "NVRTC {} ({}): {} kernel(s) × {} arch(s)",
        build.nvrtc,
        build.nvrtc_path,
        build.kernel_count,
        archs.len()
    );
    for r in &build.compiled {
        let status = if r.ok { "ok" } else { "FAILED" };
        println!(
            "  {:<8} {:<10} {:<6} {:>7} B",
            r.arch, r.kernel, status, r.bytes
        );
        if !r.ok || !r.log.trim().is_empty() {
            for line in r.log.trim().lines() {
                println!("      {line}");
            }
        }
    }
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_string_pretty(&build)?)?;
    }
    let failed = build.failures().count();
    if failed > 0 {
        eprintln!(
            "unirt: {failed} of {} compilations failed",
            build.compiled.len()
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
