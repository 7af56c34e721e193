//! The opened wgpu device: its one queue, submissions and their completion, and the encoding
//! of recorded commands.
//!
//! Every submission gets a sequence number under one lock, so the queue's submission order is
//! the order of the numbers; with one queue that is also execution order, which is what makes
//! cross-stream waits hold without any device-side wait. A callback on each submission raises
//! [`Gpu::completed`]; queries poll the device without blocking and compare.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::contents::TexContents;
use super::event::Slot;
use super::kernels::Kernels;
use super::memory::{create_buffer, wgpu_error, DevBuf, StagingPool};
use super::plan::Plan;
use crate::checked::Pins;
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::fork::Epoch;
use crate::progress::Progress;

/// How long the queue may sit empty with a submission's completion unreported before a wait
/// gives up with an error.
const LOST_CALLBACKS: std::time::Duration = std::time::Duration::from_secs(10);

mod in_flight;

/// Between polls: yield for the first few milliseconds (most waits end there, and the
/// device's own threads get the core), then sleep a little longer each round, up to 200 µs.
struct Backoff {
    start: std::time::Instant,
    rounds: u32,
}

impl Backoff {
    fn new() -> Self {
        Backoff {
            start: std::time::Instant::now(),
            rounds: 0,
        }
    }

    fn pause(&mut self) {
        if self.start.elapsed() < std::time::Duration::from_millis(5) {
            std::thread::yield_now();
        } else {
            self.rounds += 1;
            let us = u64::from(self.rounds.saturating_mul(10)).min(200);
            std::thread::sleep(std::time::Duration::from_micros(us));
        }
    }
}

/// A submission, by its sequence number (0: nothing was ever submitted).
#[derive(Clone, Debug, Default)]
pub(crate) struct Ticket {
    pub seq: u64,
}

pub(crate) struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub name: String,
    /// Events are stamped by the device (timestamp queries inside encoders).
    pub timing: bool,
    pub kernels: Kernels,
    /// The sequence number of the last submission, and the lock that orders submissions.
    submitted: Mutex<Ticket>,
    /// The highest sequence number known complete.
    completed: Arc<Completion>,
    /// The highest sequence number the submitter thread has given to the queue.
    handed: Arc<Progress>,
    /// To the submitter thread.
    jobs: crossbeam_channel::Sender<Job>,
    /// Reusable staging buffers for host copies.
    pub staging: Arc<StagingPool>,
    /// What the operator textures hold (see `contents.rs`); decided under `submitted`.
    pub contents: Arc<TexContents>,
    /// The first error wgpu reported outside an error scope, reported once by a wait.
    uncaptured: Arc<Mutex<Option<String>>>,
    /// Why the device was lost, if it was.
    lost: Arc<Mutex<Option<String>>>,
    /// Submitters' waits for room (see [`Gpu::make_room`]).
    room: crate::progress::Backpressure,
    /// The submitter thread and the driver's threads exist only in this process image: in a
    /// forked child the device is unusable (`Error::Forked`), never waited for.
    born: Epoch,
    /// The device is waited idle by the exit hook while it is open (`exit.rs`).
    _exit: super::exit::TrackedDevice,
}

fn driver(call: &str, message: impl std::fmt::Display) -> Error {
    Error::Driver {
        backend: DeviceKind::Wgpu,
        call: call.into(),
        code: None,
        message: message.to_string(),
    }
}

/// Requests the wgpu device of `adapter` with the adapter's own limits and the features unirt
/// uses; the error is the driver's reason, e.g. "request_device: Parent device is lost".
pub(crate) fn request(
    adapter: &wgpu::Adapter,
) -> std::result::Result<(wgpu::Device, wgpu::Queue), String> {
    let _pass = super::exit::enter().map_err(|e| e.to_string())?;
    let features = super::adapter::wanted_features(&adapter.features());
    let desc = wgpu::DeviceDescriptor {
        label: Some("unirt"),
        required_features: features,
        required_limits: adapter.limits(),
        experimental_features: if features.intersects(wgpu::Features::all_experimental_mask()) {
            // SAFETY: the only experimental feature asked for is the cooperative matrices
            // (`wanted_features`, opt-in), used by kernels whose operands lie in workgroup
            // arrays sized for every load and store they make (`kernels/matmul_coop.rs`).
            unsafe { wgpu::ExperimentalFeatures::enabled() }
        } else {
            wgpu::ExperimentalFeatures::disabled()
        },
        memory_hints: wgpu::MemoryHints::Performance,
        trace: wgpu::Trace::Off,
    };
    // request_device panics on some misuse (documented); the arguments come from the adapter
    // itself, and the unwind guard keeps a driver surprise from escaping.
    let requested = catch_unwind(AssertUnwindSafe(|| {
        pollster::block_on(adapter.request_device(&desc))
    }))
    .map_err(|_| "request_device panicked".to_string())?;
    // The driver may have registered exit handlers while making its device.
    super::exit::driver_loaded();
    requested.map_err(|e| format!("request_device: {e}"))
}

impl Gpu {
    /// Sets up the opened wgpu device of `adapter`: `opened` is the device and queue the
    /// discovery's test-open created (taken by the first open), else they are requested now.
    pub fn open(
        adapter: &wgpu::Adapter,
        opened: Option<(wgpu::Device, wgpu::Queue)>,
        name: String,
    ) -> Result<Self> {
        let (device, queue) = match opened {
            Some(pair) => pair,
            None => {
                request(adapter).map_err(|e| Error::DeviceNotInitialized(format!("{name}: {e}")))?
            }
        };
        let uncaptured = Arc::new(Mutex::new(None));
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            sink.lock().get_or_insert_with(|| e.to_string());
        }));
        let lost = Arc::new(Mutex::new(None));
        let lost_sink = lost.clone();
        device.set_device_lost_callback(move |reason, msg| {
            lost_sink
                .lock()
                .get_or_insert_with(|| format!("{reason:?}: {msg}"));
        });
        let tracked = super::exit::track(&device);
        let timing = super::adapter::device_timing(&device.features());
        let kernels = Kernels::new(&device);
        let completed = Arc::new(Completion::default());
        let staging = Arc::new(StagingPool::default());
        let handed = Arc::new(Progress::new());
        let (jobs, rx) = crossbeam_channel::unbounded();
        let contents = Arc::new(TexContents::default());
        let submitter = Submitter {
            device: device.clone(),
            queue: queue.clone(),
            completed: completed.clone(),
            handed: handed.clone(),
            errors: uncaptured.clone(),
            staging: staging.clone(),
            contents: contents.clone(),
        };
        std::thread::Builder::new()
            .name("unirt-wgpu-submit".into())
            .spawn(move || submitter.run(rx))
            .map_err(|e| Error::Internal(format!("cannot start the submitter thread: {e}")))?;
        Ok(Gpu {
            device,
            queue,
            name,
            timing,
            kernels,
            submitted: Mutex::new(Ticket::default()),
            completed,
            handed,
            jobs,
            staging,
            contents,
            uncaptured,
            lost,
            room: in_flight::backpressure(),
            born: Epoch::now(),
            _exit: tracked,
        })
    }

    /// Fails once the device is lost, and in a forked child.
    pub fn alive(&self) -> Result<()> {
        self.born.check(&self.name)?;
        match &*self.lost.lock() {
            None => Ok(()),
            Some(why) => Err(Error::DeviceNotInitialized(format!(
                "{}: the wgpu device was lost ({why})",
                self.name
            ))),
        }
    }

    /// A buffer of this device (errors, not panics, on bad sizes or exhaustion).
    pub fn buffer(&self, size: u64, usage: wgpu::BufferUsages) -> Result<wgpu::Buffer> {
        create_buffer(&self.device, size, usage, false, &self.name)
    }

    /// The last submission so far.
    pub fn last(&self) -> Ticket {
        self.submitted.lock().clone()
    }

    /// Encodes `plan` into one command buffer (on this thread, inside an error scope) and
    /// hands it to the submitter thread; returns the submission's ticket. `keep` — the memory
    /// the commands use — is held until the submission has completed, read-backs included.
    /// The plan's texture decisions ([`Plan::decide`]) are taken under the lock that orders
    /// submissions: before encoding when the plan copies into textures (the lock is then held
    /// until the submission has its ticket), else when it is handed over, so that other
    /// streams' encoding does not wait for this one.
    pub fn submit(&self, plan: &Plan, keep: Pins<DevBuf>) -> Result<Ticket> {
        self.alive()?;
        self.make_room();
        let early = plan.copies_to_textures.then(|| self.submitted.lock());
        let skips = match early {
            Some(_) => plan.decide(&self.contents),
            None => Vec::new(),
        };
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut enc = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        let records = plan.encode(&mut enc, || self.timestamp_buffer(), &skips);
        let cb = enc.finish();
        if let Some(e) = pollster::block_on(scope.pop()) {
            // Its copies were counted as done: no texture's contents are known now.
            self.contents.forget_all();
            return Err(wgpu_error("command encoding", e));
        }
        let last = early.unwrap_or_else(|| {
            let last = self.submitted.lock();
            plan.decide(&self.contents);
            last
        });
        self.hand_over(last, Work::Encoded(cb), records, plan.io.clone(), keep)
    }

    /// Hands a graph's plan — validated at instantiate ([`Gpu::validate`]) — to the submitter
    /// thread, which encodes and submits it: the caller's thread only makes the buffers its
    /// event records' timestamps land in. Returns the submission's ticket; `keep` as in
    /// [`Gpu::submit`].
    pub fn submit_prepared(&self, plan: &Arc<Plan>, keep: Pins<DevBuf>) -> Result<Ticket> {
        self.alive()?;
        self.make_room();
        let mut stamps = Vec::new();
        let mut records = Vec::with_capacity(plan.records.len());
        for e in &plan.records {
            let read = match e.query {
                Some(_) => {
                    let b = self.timestamp_buffer();
                    stamps.push(b.clone());
                    b
                }
                None => None,
            };
            records.push((e.clone(), read));
        }
        let last = self.submitted.lock();
        let work = Work::Plan {
            skips: plan.decide(&self.contents),
            plan: plan.clone(),
            stamps,
        };
        self.hand_over(last, work, records, plan.io.clone(), keep)
    }

    /// Gives the submission its ticket, ties its event records to it, and sends it to the
    /// submitter thread.
    fn hand_over(
        &self,
        mut last: parking_lot::MutexGuard<'_, Ticket>,
        work: Work,
        records: Vec<(Arc<super::event::WEvent>, Option<wgpu::Buffer>)>,
        io: Option<Arc<super::plan::Io>>,
        keep: Pins<DevBuf>,
    ) -> Result<Ticket> {
        let ticket = Ticket { seq: last.seq + 1 };
        let slots: Vec<Arc<Slot>> = records
            .into_iter()
            .map(|(e, read)| {
                let slot = Arc::new(Slot::new(ticket.clone(), read));
                *e.last.lock() = Some(slot.clone());
                slot
            })
            .collect();
        let job = Job {
            seq: ticket.seq,
            work,
            io,
            slots,
            keep,
        };
        self.jobs.send(job).map_err(|_| {
            self.contents.forget_all();
            Error::Internal(format!("{}: the submitter thread has exited", self.name))
        })?;
        *last = ticket.clone();
        Ok(ticket)
    }

    /// Encodes `plan` inside an error scope without submitting it: what a replay encodes
    /// later is valid.
    pub fn validate(&self, plan: &Plan) -> Result<()> {
        self.alive()?;
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut enc = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        // Timestamps need no buffer to be validated.
        drop(plan.encode(&mut enc, || None, &[]));
        drop(enc.finish());
        match pollster::block_on(scope.pop()) {
            Some(e) => Err(wgpu_error("command encoding", e)),
            None => Ok(()),
        }
    }

    /// The buffer an event record's timestamp is copied into (None: the record falls back
    /// to the host clock).
    fn timestamp_buffer(&self) -> Option<wgpu::Buffer> {
        self.buffer(
            8,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )
        .ok()
    }

    /// Whether the submission has completed (polls the device without blocking).
    pub fn is_done(&self, t: &Ticket) -> Result<bool> {
        if self.completed.done() >= t.seq {
            return Ok(true);
        }
        self.alive()?;
        if self.handed.get() < t.seq {
            return Ok(false);
        }
        self.device
            .poll(wgpu::PollType::Poll)
            .map_err(|e| driver("device.poll", e))?;
        Ok(self.completed.done() >= t.seq)
    }

    /// Blocks until the submission has completed; reports an error wgpu raised meanwhile.
    pub fn wait(&self, t: &Ticket) -> Result<()> {
        self.alive()?;
        self.handed.wait_for(t.seq);
        let mut idle_since: Option<std::time::Instant> = None;
        let mut backoff = Backoff::new();
        while self.completed.done() < t.seq {
            self.alive()?;
            let empty = self.poll_once()?;
            if self.completed.done() >= t.seq {
                break;
            }
            if empty {
                // The queue has run everything, yet this submission's completion callbacks
                // have not: give callbacks running on another thread a moment, then report
                // instead of hanging.
                let since = *idle_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() > LOST_CALLBACKS {
                    return Err(Error::Internal(format!(
                        "{}: submission {} finished but its completion was never reported",
                        self.name, t.seq
                    )));
                }
            }
            backoff.pause();
        }
        // A device lost while (or before) the work ran completes its submissions without
        // running them: that is not success.
        self.alive()?;
        match self.uncaptured.lock().take() {
            Some(msg) => Err(driver("(uncaptured)", msg)),
            None => Ok(()),
        }
    }

    /// Asks wgpu whether the device is still there (one non-blocking poll, which is where
    /// wgpu notices a loss and runs the lost-device callback), then [`alive`](Self::alive).
    pub fn check_lost(&self) -> Result<()> {
        self.alive()?;
        self.poll_once()?;
        self.alive()
    }

    /// One non-blocking poll; returns whether the queue is empty.
    ///
    /// Waits never block inside wgpu: two threads polling with `PollType::Wait` (or one waiting
    /// while another submits) can trip an assertion in wgpu-core 30's `Device::maintain`, and
    /// the GL backend holds its context lock for the whole of a blocking wait (other threads
    /// panic after seconds without it). So every waiter polls and backs off on its own.
    fn poll_once(&self) -> Result<bool> {
        match self.device.poll(wgpu::PollType::Poll) {
            Ok(status) => Ok(status.is_queue_empty()),
            Err(e) => Err(driver("device.poll", e)),
        }
    }

    /// Maps a MAP_READ buffer whose writes were submitted, and copies its first `len` bytes.
    pub fn read_mappable(&self, buf: &wgpu::Buffer, len: u64) -> Result<Vec<u8>> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let mut backoff = Backoff::new();
        buf.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        let mapped = loop {
            if let Ok(r) = rx.try_recv() {
                break r;
            }
            self.alive()?;
            self.device
                .poll(wgpu::PollType::Poll)
                .map_err(|e| driver("device.poll", e))?;
            backoff.pause();
        };
        mapped.map_err(|e| driver("buffer.map_async", e))?;
        let out = {
            let view = buf
                .slice(..)
                .get_mapped_range()
                .map_err(|e| driver("get_mapped_range", e))?;
            view[..(len as usize).min(view.len())].to_vec()
        };
        buf.unmap();
        Ok(out)
    }
}

/// Registers the host side of a device-to-host copy: when the submission that fills
/// `staging` completes, bytes `[skip, skip + len)` of it land at `host`; then `done` runs.
fn readback(
    staging: &wgpu::Buffer,
    skip: u64,
    host: u64,
    len: usize,
    done: impl FnOnce(std::result::Result<(), String>, wgpu::Buffer) + Send + 'static,
) {
    let buf = staging.clone();
    staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
        if let Err(e) = r {
            return done(Err(format!("read-back map failed: {e}")), buf);
        }
        let result = match buf.slice(..).get_mapped_range() {
            Ok(view) => {
                let start = skip as usize;
                match view.get(start..start + len) {
                    Some(src) => {
                        // SAFETY: `host` is the destination of a device-to-host copy; the
                        // caller of memcpy/memcpy_async promised it is writable for `len`
                        // bytes until the stream has passed the copy, and the stream
                        // does not count as past it until this callback has run.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                src.as_ptr(),
                                host as usize as *mut u8,
                                len,
                            )
                        };
                        Ok(())
                    }
                    None => Err("read-back range outside its staging buffer".to_string()),
                }
            }
            Err(e) => Err(format!("read-back view failed: {e}")),
        };
        buf.unmap();
        done(result, buf);
    });
}

/// Which submissions are complete: each finishes out of order (queue done, read-backs
/// done), the counter moves over the contiguous prefix, as one queue completes in order.
#[derive(Default)]
struct Completion {
    progress: Progress,
    early: Mutex<std::collections::BTreeSet<u64>>,
}

impl Completion {
    fn done(&self) -> u64 {
        self.progress.get()
    }

    fn finish(&self, seq: u64) {
        let mut early = self.early.lock();
        early.insert(seq);
        let mut upto = self.progress.get();
        while early.remove(&(upto + 1)) {
            upto += 1;
        }
        self.progress.advance(upto);
    }
}

/// One command buffer on its way to the queue, with what must happen around its submit.
struct Job {
    seq: u64,
    work: Work,
    /// Uploads before the submit, read-backs and recycled buffers after it.
    io: Option<Arc<super::plan::Io>>,
    slots: Vec<Arc<Slot>>,
    /// The memory the commands use (pinned host memory a read-back writes, in particular).
    keep: Pins<DevBuf>,
}

/// What a job submits.
enum Work {
    /// Encoded by the caller (a stream's batch, inside an error scope there).
    Encoded(wgpu::CommandBuffer),
    /// A graph's validated plan, encoded on the submitter thread; `stamps`: the buffers for
    /// the timestamps of its records that have a query set, in order (made by the caller, as
    /// the records' slots name them).
    Plan {
        plan: Arc<Plan>,
        stamps: Vec<Option<wgpu::Buffer>>,
        /// Its texture decisions, taken when it was handed over ([`Plan::decide`]).
        skips: Vec<bool>,
    },
}

/// The thread that submits to the queue, in sequence order.
///
/// Submitting off the caller's thread keeps enqueueing asynchronous on backends whose submit
/// runs the work before it returns (GL on llvmpipe executes compute dispatches inside
/// `queue.submit`), so an event recorded behind long work is NOT_READY there as well.
struct Submitter {
    device: wgpu::Device,
    queue: wgpu::Queue,
    completed: Arc<Completion>,
    handed: Arc<Progress>,
    errors: Arc<Mutex<Option<String>>>,
    staging: Arc<StagingPool>,
    contents: Arc<TexContents>,
}

impl Submitter {
    fn run(self, rx: crossbeam_channel::Receiver<Job>) {
        for job in rx {
            let seq = job.seq;
            match super::exit::enter() {
                Ok(_pass) => {
                    if catch_unwind(AssertUnwindSafe(|| self.submit(job))).is_err() {
                        self.never_ran(seq, "panicked in wgpu");
                    }
                }
                Err(_) => {
                    // The process is exiting: what the job holds is leaked rather than
                    // dropped through wgpu.
                    self.never_ran(seq, "was refused: the process is exiting");
                    std::mem::forget(job);
                }
            }
            self.handed.advance(seq);
        }
    }

    /// Submission `seq` did not happen: the next wait reports why, nobody waits forever on
    /// it, and its copies into textures did not happen either.
    fn never_ran(&self, seq: u64, why: &str) {
        self.errors
            .lock()
            .get_or_insert_with(|| format!("submission {seq} {why}"));
        self.contents.forget_all();
        self.completed.finish(seq);
    }

    fn submit(&self, job: Job) {
        let io = job.io.as_deref();
        for u in io.map_or(&[][..], |io| &io.uploads[..]) {
            // SAFETY: `host` is the source of a captured host-to-device copy; the caller of
            // memcpy_async promised it stays readable for `len` bytes while the graph is
            // replayed (the same contract as CUDA's graph memcpy nodes).
            let src = unsafe { std::slice::from_raw_parts(u.host as usize as *const u8, u.len) };
            if u.off == 0 && u.len % 4 == 0 {
                self.queue.write_buffer(&u.staging, 0, src);
                continue;
            }
            // write_buffer moves whole words: the bytes sit at their phase `off`.
            let start = u.off as usize;
            let mut words = vec![0u8; (start + u.len).div_ceil(4) * 4];
            words[start..start + u.len].copy_from_slice(src);
            self.queue.write_buffer(&u.staging, 0, &words);
        }
        let cb = match job.work {
            Work::Encoded(cb) => cb,
            Work::Plan {
                plan,
                stamps,
                skips,
            } => {
                let mut enc = self
                    .device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
                let mut stamps = stamps.into_iter();
                // Validated at instantiate: anything wgpu still reports reaches the
                // uncaptured-error sink, which the next wait reports.
                drop(plan.encode(&mut enc, || stamps.next().flatten(), &skips));
                enc.finish()
            }
        };
        self.queue.submit([cb]);
        for b in io.map_or(&[][..], |io| &io.recycle[..]) {
            self.staging.recycle_upload(b.clone());
        }
        let readbacks = io.map_or(&[][..], |io| &io.readbacks[..]);
        // The submission counts as complete once the queue has run it and every read-back has
        // reached the host; wgpu does not promise an order between the two kinds of callback
        // when several threads poll, so each one checks in.
        let (seq, slots) = (job.seq, job.slots);
        let parts = Arc::new(AtomicUsize::new(readbacks.len() + 1));
        let keep = Mutex::new(Some(job.keep));
        let check_in = {
            let completed = self.completed.clone();
            move || {
                if parts.fetch_sub(1, Ordering::AcqRel) == 1 {
                    // Nothing of this submission touches its memory any more.
                    drop(keep.lock().take());
                    completed.finish(seq);
                }
            }
        };
        let check_in = Arc::new(check_in);
        for rb in readbacks {
            let done = check_in.clone();
            let errors = self.errors.clone();
            let pool = self.staging.clone();
            let pooled = rb.pooled;
            readback(&rb.staging, rb.skip, rb.host, rb.len, move |r, buf| {
                if r.is_ok() && pooled {
                    pool.recycle_read(buf);
                }
                if let Err(e) = r {
                    errors.lock().get_or_insert(e);
                }
                done();
            });
        }
        self.queue.on_submitted_work_done(move || {
            for s in &slots {
                s.stamp_host();
            }
            check_in();
        });
    }
}
