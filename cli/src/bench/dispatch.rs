//! `unirt bench dispatch`: kernel launch throughput on a wgpu (or any) device.
//!
//! Two workloads, every figure from the same run, medians of alternating samples:
//! - bandwidth-bound: 100 × `add_f32` on 1 Mi floats plus one read-back of the result,
//!   through unirt and through a hand-written plain-wgpu program doing the same on the same
//!   adapter (one bind group made ahead, 100 dispatches in one compute pass, one submit, a
//!   mapped read-back) — the best a direct wgpu user writes;
//! - launch-bound, in two shapes (100 × `add_f32` on 256 floats, 1000 × `add_f32` on 1
//!   float): issued eagerly, against the same launches captured once and replayed, against
//!   the plain-wgpu program doing the same dispatches (one pass, one prepared bind group, one
//!   submit), the three sampled in turn; each also timed for issue alone (no wait).
//!
//! Same work on both sides: the same WGSL arithmetic with 256-invocation workgroups, one
//! workgroup per 256 elements, `a` and `b` bound read-only and `out` read-write over buffers of
//! exactly n floats, no immediates (unirt binds its three pointers directly and takes the
//! count from `out`'s binding, see vendors/wgpu/kernels/fixed.rs).
//!
//! The issue-only figures are not like for like: unirt's eager one is recording the launches
//! (the batch is encoded into wgpu's command encoder, and submitted, inside the synchronize),
//! its replay one is handing the prepared plan to the submitter thread (which encodes it),
//! the plain one is the whole wgpu encode and submit.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use unirt::{Backend, BackendExt, CaptureMode, Device, DeviceKind, KernelArg, StreamId};

use super::stats::{median, write_rows};
use crate::CliResult;

const LAUNCHES: usize = 100;
const BIG: u32 = 1 << 20;
const SMALL: u32 = 256;
/// Launches of the 1-element shape.
const TINY_LAUNCHES: usize = 1000;

#[derive(Serialize)]
#[serde(untagged)]
enum Row {
    Bandwidth {
        workload: &'static str,
        unirt_ms: f64,
        plain_wgpu_ms: f64,
    },
    Launch {
        workload: String,
        eager_ms: f64,
        replay_ms: f64,
        /// Issuing the launches alone (no wait): unirt's own per-launch cost. The wgpu
        /// encoding of the batch is not in it: that happens at the synchronize.
        eager_issue_ms: f64,
        /// `graph_launch` alone (no wait): encoding the prepared plan and handing it over.
        replay_issue_ms: f64,
        /// The same dispatches in hand-written wgpu (one pass, one prepared bind group,
        /// one submit, then a wait): the floor this device allows.
        plain_wgpu_ms: f64,
        /// The plain program's encode and submit alone (no wait).
        plain_issue_ms: f64,
    },
}

/// Median milliseconds of each of `runs`, sampled in turn (a round of each, then the next
/// round) after one warm-up of each: every side sees the same device state (clocks, caches).
fn time_alternating<const N: usize>(
    reps: usize,
    mut runs: [&mut dyn FnMut() -> CliResult<()>; N],
) -> CliResult<[f64; N]> {
    for run in runs.iter_mut() {
        run()?;
    }
    let mut samples: [Vec<f64>; N] = std::array::from_fn(|_| Vec::with_capacity(reps));
    for _ in 0..reps {
        for (run, s) in runs.iter_mut().zip(samples.iter_mut()) {
            let t = Instant::now();
            run()?;
            s.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    Ok(samples.map(|mut s| median(&mut s)))
}

/// Median milliseconds of issuing the 100 launches, and of one `graph_launch`, each followed
/// by an untimed wait.
fn issue_only(
    dev: &Arc<unirt::AnyBackend>,
    s: StreamId,
    exec: unirt::GraphExecId,
    reps: usize,
    issue: &dyn Fn(&Arc<unirt::AnyBackend>, StreamId) -> unirt::Result<()>,
) -> CliResult<(f64, f64)> {
    let (mut e, mut r) = (Vec::new(), Vec::new());
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        issue(dev, s)?;
        e.push(t.elapsed().as_secs_f64() * 1e3);
        dev.stream_synchronize(s)?;
        let t = Instant::now();
        dev.graph_launch(exec, s)?;
        r.push(t.elapsed().as_secs_f64() * 1e3);
        dev.stream_synchronize(s)?;
    }
    Ok((median(&mut e), median(&mut r)))
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

/// Runs the benchmark on `device` and prints (and optionally writes) the rows.
pub fn run(device: &str, json: Option<&Path>, reps: usize) -> CliResult<ExitCode> {
    let device: Device = device.parse()?;
    if device.kind != DeviceKind::Wgpu {
        // Its baseline is a plain-wgpu program; on other vendors there is nothing to compare.
        return Err(format!(
            "bench dispatch measures wgpu devices against a plain-wgpu program; {device} is not \
             a wgpu device (bench latency measures launches on any device)"
        )
        .into());
    }
    let dev = unirt::open(device)?;
    let info = dev.info().clone();
    println!("dispatch on {device} ({}, {})", info.name, info.api);
    let s = dev.stream_create()?;
    let mut rows = Vec::new();

    // Bandwidth-bound: unirt beside plain wgpu.
    let n = BIG as usize;
    let a_host: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b_host: Vec<f32> = (0..n).map(|i| 0.5 * i as f32).collect();
    let (a, b, out) = (dev.malloc(4 * n)?, dev.malloc(4 * n)?, dev.malloc(4 * n)?);
    dev.copy_to_device(a, &f32_bytes(&a_host))?;
    dev.copy_to_device(b, &f32_bytes(&b_host))?;
    let mut result = vec![0u8; 4 * n];
    let args = [a.into(), b.into(), out.into(), KernelArg::U32(BIG)];
    let plain = if device.kind == DeviceKind::Wgpu {
        Some(plain::Plain::new(&info.name, &info.api, &a_host, &b_host)?)
    } else {
        None
    };
    let mut plain_result = vec![0f32; n];
    let [unirt_ms, plain_ms] = time_alternating(
        reps,
        [
            &mut || {
                for _ in 0..LAUNCHES {
                    dev.launch("add_f32", &args, s)?;
                }
                // SAFETY: `result` is a live vector of 4n bytes; the copy completes on return.
                unsafe {
                    dev.memcpy_async(
                        result.as_mut_ptr() as usize as u64,
                        out.0,
                        4 * n,
                        unirt::MemcpyKind::D2H,
                        s,
                    )?
                };
                dev.stream_synchronize(s)?;
                Ok(())
            },
            &mut || match &plain {
                Some(p) => p.run(LAUNCHES, &mut plain_result, true),
                None => Ok(()),
            },
        ],
    )?;
    let want = a_host[n - 1] + b_host[n - 1];
    let got = f32::from_le_bytes([
        result[4 * n - 4],
        result[4 * n - 3],
        result[4 * n - 2],
        result[4 * n - 1],
    ]);
    if got != want || (plain.is_some() && plain_result[n - 1] != want) {
        return Err(format!(
            "wrong result: unirt {got}, plain {}, want {want}",
            plain_result[n - 1]
        )
        .into());
    }
    println!(
        "add_f32_1Mi_x100  unirt {unirt_ms:8.2} ms   plain wgpu {plain_ms:8.2} ms   unirt/plain throughput {:.2}",
        plain_ms / unirt_ms
    );
    rows.push(Row::Bandwidth {
        workload: "add_f32_1Mi_x100",
        unirt_ms,
        plain_wgpu_ms: plain_ms,
    });
    dev.free(a)?;
    dev.free(b)?;
    dev.free(out)?;

    // Launch-bound: eager against replay against plain wgpu, in two shapes.
    for (launches, elems) in [(LAUNCHES, SMALL), (TINY_LAUNCHES, 1)] {
        rows.push(launch_bound(&dev, s, &info, launches, elems, reps)?);
    }
    dev.stream_destroy(s)?;
    write_rows(json, &rows)?;
    Ok(ExitCode::SUCCESS)
}

/// One launch-bound shape: `launches` × `add_f32` on `elems` floats, issued eagerly then
/// synchronized, against the same launches captured once and replayed, against plain wgpu.
fn launch_bound(
    dev: &Arc<unirt::AnyBackend>,
    s: StreamId,
    info: &unirt::DeviceInfo,
    launches: usize,
    elems: u32,
    reps: usize,
) -> CliResult<Row> {
    let workload = format!("add_f32_{elems}_x{launches}");
    let bytes = 4 * elems as usize;
    let (a, b, out) = (dev.malloc(bytes)?, dev.malloc(bytes)?, dev.malloc(bytes)?);
    dev.memset(a, 0, bytes)?;
    dev.memset(b, 0, bytes)?;
    let args = [a.into(), b.into(), out.into(), KernelArg::U32(elems)];
    let issue = |dev: &Arc<unirt::AnyBackend>, s: StreamId| -> unirt::Result<()> {
        for _ in 0..launches {
            dev.launch("add_f32", &args, s)?;
        }
        Ok(())
    };
    dev.begin_capture(s, CaptureMode::Global)?;
    let captured = issue(dev, s);
    let graph = dev.end_capture(s)?;
    captured?;
    let exec = dev.graph_instantiate(graph)?;
    let zeros = vec![0f32; elems as usize];
    let p = plain::Plain::new(&info.name, &info.api, &zeros, &zeros)?;
    let mut host = vec![0f32; elems as usize];
    let [eager_ms, replay_ms, plain_ms] = time_alternating(
        reps,
        [
            &mut || {
                issue(dev, s)?;
                dev.stream_synchronize(s)?;
                Ok(())
            },
            &mut || {
                dev.graph_launch(exec, s)?;
                dev.stream_synchronize(s)?;
                Ok(())
            },
            &mut || p.run(launches, &mut host, false),
        ],
    )?;
    let (eager_issue_ms, replay_issue_ms) = issue_only(dev, s, exec, reps, &issue)?;
    let plain_issue_ms = p.issue_only(launches, reps)?;
    println!(
        "{workload:<18}eager {eager_ms:8.3} ms   replay {replay_ms:8.3} ms   plain wgpu {plain_ms:8.3} ms   eager/plain {:.2}  replay/plain {:.2}",
        eager_ms / plain_ms,
        replay_ms / plain_ms
    );
    println!(
        "{:<18}issue only: eager {eager_issue_ms:.3} ms, replay {replay_issue_ms:.3} ms, plain wgpu (encode + submit) {plain_issue_ms:.3} ms",
        ""
    );
    dev.graph_exec_destroy(exec)?;
    dev.graph_destroy(graph)?;
    dev.free(a)?;
    dev.free(b)?;
    dev.free(out)?;
    Ok(Row::Launch {
        workload,
        eager_ms,
        replay_ms,
        eager_issue_ms,
        replay_issue_ms,
        plain_wgpu_ms: plain_ms,
        plain_issue_ms,
    })
}

/// The plain-wgpu baseline: what a direct wgpu user writes for the same work.
mod plain {
    use std::sync::Arc;

    use parking_lot::Mutex;

    use crate::CliResult;

    const SHADER: &str = r#"
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < arrayLength(&out)) {
        out[i] = a[i] + b[i];
    }
}
"#;

    pub struct Plain {
        device: wgpu::Device,
        queue: wgpu::Queue,
        pipeline: wgpu::ComputePipeline,
        group: wgpu::BindGroup,
        out: wgpu::Buffer,
        staging: wgpu::Buffer,
        n: u32,
        errors: Arc<Mutex<Option<String>>>,
    }

    fn backend_name(b: wgpu::Backend) -> &'static str {
        match b {
            wgpu::Backend::Vulkan => "vulkan",
            wgpu::Backend::Metal => "metal",
            wgpu::Backend::Dx12 => "dx12",
            wgpu::Backend::Gl => "gl",
            _ => "other",
        }
    }

    impl Plain {
        /// Opens the adapter with this name and API, and prepares everything ahead.
        pub fn new(name: &str, api: &str, a: &[f32], b: &[f32]) -> CliResult<Self> {
            let instance = wgpu::Instance::new(
                wgpu::InstanceDescriptor::new_without_display_handle_from_env(),
            );
            let adapter = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()))
                .into_iter()
                .find(|ad| {
                    let i = ad.get_info();
                    i.name == name && backend_name(i.backend) == api
                })
                .ok_or_else(|| format!("plain wgpu: no adapter {name} ({api})"))?;
            let (device, queue) =
                pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
                    label: None,
                    required_features: wgpu::Features::empty(),
                    required_limits: adapter.limits(),
                    experimental_features: wgpu::ExperimentalFeatures::disabled(),
                    memory_hints: wgpu::MemoryHints::Performance,
                    trace: wgpu::Trace::Off,
                }))?;
            let errors = Arc::new(Mutex::new(None));
            let sink = errors.clone();
            device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                sink.lock().get_or_insert_with(|| e.to_string());
            }));
            let bytes = (a.len() * 4) as u64;
            let storage = |data: &[f32], usage| {
                let buf = device.create_buffer(&wgpu::BufferDescriptor {
                    label: None,
                    size: bytes,
                    usage,
                    mapped_at_creation: false,
                });
                queue.write_buffer(&buf, 0, bytemuck::cast_slice(data));
                buf
            };
            let ua = storage(
                a,
                wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            );
            let ub = storage(
                b,
                wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            );
            let out = device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: bytes,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            let staging = device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: None,
                source: wgpu::ShaderSource::Wgsl(SHADER.into()),
            });
            let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: None,
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
            let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &pipeline.get_bind_group_layout(0),
                entries: &[
                    wgpu::BindGroupEntry {
                        binding: 0,
                        resource: ua.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 1,
                        resource: ub.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 2,
                        resource: out.as_entire_binding(),
                    },
                ],
            });
            let p = Plain {
                device,
                queue,
                pipeline,
                group,
                out,
                staging,
                n: a.len() as u32,
                errors,
            };
            p.check()?;
            Ok(p)
        }

        fn check(&self) -> CliResult<()> {
            match self.errors.lock().take() {
                Some(e) => Err(format!("plain wgpu: {e}").into()),
                None => Ok(()),
            }
        }

        /// Median milliseconds of encoding `launches` dispatches and submitting them (the
        /// wait after each is not timed).
        pub fn issue_only(&self, launches: usize, reps: usize) -> CliResult<f64> {
            let mut t = Vec::with_capacity(reps.max(1));
            for _ in 0..reps.max(1) {
                let start = std::time::Instant::now();
                self.queue.submit([self.encode(launches)]);
                t.push(start.elapsed().as_secs_f64() * 1e3);
                self.device.poll(wgpu::PollType::wait_indefinitely())?;
            }
            self.check()?;
            Ok(super::median(&mut t))
        }

        fn encode(&self, launches: usize) -> wgpu::CommandBuffer {
            let mut enc = self
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
            {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                pass.set_pipeline(&self.pipeline);
                pass.set_bind_group(0, &self.group, &[]);
                for _ in 0..launches {
                    pass.dispatch_workgroups(self.n.div_ceil(256), 1, 1);
                }
            }
            enc.finish()
        }

        /// `launches` dispatches in one pass, one submit, then the result read back (`read`)
        /// or just waited for.
        pub fn run(&self, launches: usize, result: &mut [f32], read: bool) -> CliResult<()> {
            if !read {
                self.queue.submit([self.encode(launches)]);
                self.device.poll(wgpu::PollType::wait_indefinitely())?;
                return self.check();
            }
            let mut enc = self
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
            enc.copy_buffer_to_buffer(&self.out, 0, &self.staging, 0, None);
            self.queue.submit([self.encode(launches), enc.finish()]);
            let (tx, rx) = crossbeam_channel::bounded(1);
            self.staging
                .slice(..)
                .map_async(wgpu::MapMode::Read, move |r| {
                    let _ = tx.send(r);
                });
            self.device.poll(wgpu::PollType::wait_indefinitely())?;
            rx.recv()??;
            {
                let view = self.staging.slice(..).get_mapped_range()?;
                result.copy_from_slice(bytemuck::cast_slice(&view));
            }
            self.staging.unmap();
            self.check()
        }
    }
}
