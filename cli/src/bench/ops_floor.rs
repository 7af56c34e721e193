//! The plain-wgpu floor of `unirt bench ops` on a wgpu device: a hand-written wgpu program
//! on the same adapter doing one elementwise op (f32 add) and one GEMM (f32, a classic 16×16
//! workgroup-memory tiled kernel, as a direct wgpu user writes it), with everything prepared
//! ahead (pipeline, bind group) and each sample one encoder, `inner` dispatches, one submit
//! and a wait — the cost floor unirt's operator dispatch must not add to.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::stats::median;
use crate::CliResult;

const ADD: &str = "
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = g.x + g.y * nwg.x * 256u;
    if (i < arrayLength(&c)) { c[i] = a[i] + b[i]; }
}
";

const GEMM: &str = "
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
override N: u32 = 1024u;
var<workgroup> ta: array<f32, 256>;
var<workgroup> tb: array<f32, 256>;
@compute @workgroup_size(16, 16)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
    var acc = 0.0;
    for (var k0 = 0u; k0 < N; k0 = k0 + 16u) {
        ta[l.y * 16u + l.x] = a[g.y * N + k0 + l.x];
        tb[l.y * 16u + l.x] = b[(k0 + l.y) * N + g.x];
        workgroupBarrier();
        for (var k = 0u; k < 16u; k = k + 1u) { acc = acc + ta[l.y * 16u + k] * tb[k * 16u + l.x]; }
        workgroupBarrier();
    }
    c[g.y * N + g.x] = acc;
}
";

/// A prepared plain-wgpu program on the adapter named `name` with API `api`.
pub struct Floor {
    device: wgpu::Device,
    queue: wgpu::Queue,
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

/// One workload ready to run: pipeline, bind group and grid.
struct Job {
    pipeline: wgpu::ComputePipeline,
    group: wgpu::BindGroup,
    grid: [u32; 2],
}

impl Floor {
    pub fn new(name: &str, api: &str) -> CliResult<Self> {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
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
        Ok(Floor {
            device,
            queue,
            errors,
        })
    }

    fn job(&self, source: &str, n: u32, elems: [u64; 3], grid: [u32; 2]) -> Job {
        let d = &self.device;
        let buf = |len: u64, fill: f32| {
            let b = d.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: len * 4,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let v = vec![fill; len as usize];
            self.queue.write_buffer(&b, 0, bytemuck::cast_slice(&v));
            b
        };
        let bufs = [buf(elems[0], 0.5), buf(elems[1], 0.25), buf(elems[2], 0.0)];
        let module = d.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: None,
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
        let constants = [("N", f64::from(n))];
        let pipeline = d.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: None,
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: if source.contains("override N") {
                    &constants
                } else {
                    &[]
                },
                ..Default::default()
            },
            cache: None,
        });
        let entries: Vec<wgpu::BindGroupEntry> = bufs
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.as_entire_binding(),
            })
            .collect();
        let group = d.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        Job {
            pipeline,
            group,
            grid,
        }
    }

    /// Milliseconds per dispatch: median of samples of `inner` dispatches in one submit.
    fn time(&self, job: &Job, inner: usize, samples: usize) -> CliResult<f64> {
        let sample = || -> CliResult<f64> {
            let t = Instant::now();
            let mut enc = self.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                pass.set_pipeline(&job.pipeline);
                pass.set_bind_group(0, &job.group, &[]);
                for _ in 0..inner {
                    pass.dispatch_workgroups(job.grid[0], job.grid[1], 1);
                }
            }
            self.queue.submit([enc.finish()]);
            self.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| format!("plain wgpu: poll: {e}"))?;
            if let Some(e) = self.errors.lock().take() {
                return Err(format!("plain wgpu: {e}").into());
            }
            Ok(t.elapsed().as_secs_f64() * 1e3 / inner as f64)
        };
        sample()?;
        let mut v = (0..samples)
            .map(|_| sample())
            .collect::<CliResult<Vec<f64>>>()?;
        Ok(median(&mut v))
    }

    /// Milliseconds of one f32 add over `n` elements.
    pub fn add(&self, n: usize) -> CliResult<f64> {
        let groups = (n as u64).div_ceil(256);
        let x = groups.min(65535) as u32;
        let y = groups.div_ceil(u64::from(x)) as u32;
        let n64 = n as u64;
        let job = self.job(ADD, 0, [n64, n64, n64], [x, y]);
        self.time(&job, 1, 15)
    }

    /// Milliseconds of one f32 `n×n×n` GEMM (`n` a multiple of 16).
    pub fn gemm(&self, n: usize) -> CliResult<f64> {
        let e = (n * n) as u64;
        let job = self.job(GEMM, n as u32, [e, e, e], [n as u32 / 16, n as u32 / 16]);
        self.time(&job, 1, 5)
    }
}
