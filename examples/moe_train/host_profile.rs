//! `moe_train --host-profile DIR`: where the host's time goes in the training steps.
//!
//! The GPU machine has no perf, gdb or Nsight Systems, and stack samples under cuda-gdb slow
//! every kernel launch, so the profiler lives in the process, over the steps after the first few
//! (which compile kernels and autotune). It samples **wall-clock** time: a thread of ours sends
//! SIGPROF (pprof's signal, whose handler records the stack of the thread it interrupts) to the
//! training thread and to CubeCL's device threads in turn, `WALL_HZ` times a second each, whether
//! they run or wait. (pprof's own timer counts process CPU time and fires at most once per
//! scheduler tick: a process keeping two threads busy got about 250 samples a second, not 999,
//! which made busy threads look idle. Its rate is set to 1 Hz here.) A thread that waits shows
//! the wait's stack: a futex under a channel's receive, a sleep in CubeCL's idle loop.
//! It writes `flamegraph.svg` and `summary.txt`: per thread, wall ms per step, the functions by
//! self time (collapsed onto their nearest Rust caller, since libcuda and libc have no symbols
//! worth reading) and by inclusive time; and the wall-clock phases of every cuBLASLt GEMM call
//! (`backend::gemm_profile`). Built with `--features host-profile`; without it, `--host-profile`
//! is an error, not a silent no-op.

// Without the feature, the report's pieces (`summary`, `gemm_phases`) serve only their tests.
#![cfg_attr(not(feature = "host-profile"), allow(dead_code))]

use std::path::{Path, PathBuf};

use burn_lowp::error::LowpError;

/// Steps left out at the start of a run before sampling begins.
pub const HOST_PROFILE_SKIP_STEPS: usize = 5;

/// Wall-clock samples per second of each sampled thread.
#[cfg(feature = "host-profile")]
const WALL_HZ: u32 = 500;

/// A running profile of the host.
pub struct HostProfile {
    dir: PathBuf,
    #[cfg(feature = "host-profile")]
    guard: pprof::ProfilerGuard<'static>,
    #[cfg(feature = "host-profile")]
    sampler: wall::WallSampler,
}

impl HostProfile {
    /// Whether a profile can be written to `dir`: checked before training starts, so that a
    /// build without the profiler fails at once rather than after the first steps.
    pub fn check(dir: &Path) -> Result<(), LowpError> {
        if !cfg!(feature = "host-profile") {
            return Err(LowpError::invalid(
                "--host-profile",
                dir.display(),
                "this build has no host profiler; build with --features host-profile",
            ));
        }
        std::fs::create_dir_all(dir).map_err(|e| LowpError::file(dir, e))
    }

    /// Starts sampling the calling (training) thread and CubeCL's device threads.
    pub fn start(dir: &Path) -> Result<Self, LowpError> {
        Self::check(dir)?;
        #[cfg(feature = "host-profile")]
        {
            let guard = pprof::ProfilerGuardBuilder::default()
                .frequency(1)
                .build()
                .map_err(|e| LowpError::invalid("--host-profile", dir.display(), format!("the sampler did not start: {e}")))?;
            let sampler = wall::WallSampler::start(WALL_HZ)
                .map_err(|e| LowpError::invalid("--host-profile", dir.display(), format!("the wall-clock sampler did not start: {e}")))?;
            burn_lowp::backend::set_gemm_profiling(true);
            Ok(Self {
                dir: dir.to_path_buf(),
                guard,
                sampler,
            })
        }
        #[cfg(not(feature = "host-profile"))]
        unreachable!("check refused a build without the profiler")
    }

    /// Stops sampling and writes `flamegraph.svg` and `summary.txt` for `steps` sampled steps.
    #[cfg_attr(not(feature = "host-profile"), allow(unused_variables))]
    pub fn finish(self, steps: usize) -> Result<PathBuf, LowpError> {
        #[cfg(feature = "host-profile")]
        {
            // Stops and joins the sampling thread first.
            drop(self.sampler);
            let report = self
                .guard
                .report()
                .build()
                .map_err(|e| LowpError::invalid("--host-profile", self.dir.display(), format!("no report: {e}")))?;
            let svg = self.dir.join("flamegraph.svg");
            let file = std::fs::File::create(&svg).map_err(|e| LowpError::file(&svg, e))?;
            report
                .flamegraph(file)
                .map_err(|e| LowpError::file(&svg, e.to_string()))?;
            let stacks: Vec<Stack> = report
                .data
                .iter()
                .map(|(frames, &count)| Stack {
                    thread: frames.thread_name_or_id(),
                    // Leaf first; within a frame, the innermost inlined function first.
                    functions: frames
                        .frames
                        .iter()
                        .flat_map(|frame| frame.iter().map(|s| short_name(&s.name())))
                        .collect(),
                    samples: count.max(0) as u64,
                })
                .collect();
            let mut text = summary(&stacks, steps, WALL_HZ as f64);
            text.push_str(&gemm_phases(&burn_lowp::backend::gemm_profile(), steps));
            burn_lowp::backend::set_gemm_profiling(false);
            let path = self.dir.join("summary.txt");
            std::fs::write(&path, text).map_err(|e| LowpError::file(&path, e))?;
        }
        Ok(self.dir)
    }
}

/// One sampled call stack and how often it was seen.
pub struct Stack {
    pub thread: String,
    /// Function names, leaf first.
    pub functions: Vec<String>,
    pub samples: u64,
}

/// A symbol without its hash suffix (`::h0123456789abcdef`).
pub fn short_name(name: &str) -> String {
    match name.rfind("::h") {
        Some(i) if name.len() - i == 19 && name[i + 3..].chars().all(|c| c.is_ascii_hexdigit()) => {
            name[..i].to_string()
        }
        _ => name.to_string(),
    }
}

/// Rust paths have `::`; C functions (libc, libcuda's exported entry points) do not.
fn is_rust(function: &str) -> bool {
    function.contains("::")
}

/// Per thread (most samples first): ms per step, the top functions by self time collapsed onto
/// their nearest Rust frame, and the top functions by inclusive time.
pub fn summary(stacks: &[Stack], steps: usize, frequency: f64) -> String {
    use std::collections::{BTreeMap, HashSet};
    use std::fmt::Write as _;
    const TOP: usize = 45;
    let ms_per_step = |samples: u64| 1e3 * samples as f64 / frequency / steps.max(1) as f64;
    let mut threads: BTreeMap<&str, Vec<&Stack>> = BTreeMap::new();
    for s in stacks {
        threads.entry(&s.thread).or_default().push(s);
    }
    let mut threads: Vec<(&str, Vec<&Stack>, u64)> = threads
        .into_iter()
        .map(|(t, v)| {
            let n = v.iter().map(|s| s.samples).sum();
            (t, v, n)
        })
        .collect();
    threads.sort_by(|a, b| b.2.cmp(&a.2));
    let mut out = String::new();
    let total: u64 = threads.iter().map(|t| t.2).sum();
    let _ = writeln!(
        out,
        "{total} wall-clock samples at {frequency} Hz per thread over {steps} steps ({:.1} ms per step, all sampled threads)",
        ms_per_step(total)
    );
    let top = |counts: BTreeMap<String, u64>| {
        let mut v: Vec<(String, u64)> = counts.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v.truncate(TOP);
        v
    };
    for (thread, stacks, samples) in &threads {
        let _ = writeln!(
            out,
            "\n## thread {thread}: {samples} samples, {:.2} ms per step",
            ms_per_step(*samples)
        );
        let mut self_time: BTreeMap<String, u64> = BTreeMap::new();
        let mut inclusive: BTreeMap<String, u64> = BTreeMap::new();
        for s in stacks {
            let leaf = s.functions.first().map(String::as_str).unwrap_or("?");
            let owner = s.functions.iter().find(|f| is_rust(f)).map(String::as_str).unwrap_or(leaf);
            let key = if owner == leaf { leaf.to_string() } else { format!("{owner} <- {leaf}") };
            *self_time.entry(key).or_default() += s.samples;
            let unique: HashSet<&String> = s.functions.iter().collect();
            for f in unique {
                *inclusive.entry(f.clone()).or_default() += s.samples;
            }
        }
        let _ = writeln!(out, "### self (nearest Rust frame <- leaf), ms per step");
        for (name, n) in top(self_time) {
            let _ = writeln!(out, "{:8.2}  {name}", ms_per_step(n));
        }
        let _ = writeln!(out, "### inclusive, ms per step");
        for (name, n) in top(inclusive) {
            let _ = writeln!(out, "{:8.2}  {name}", ms_per_step(n));
        }
    }
    out
}

/// The GEMM calls' wall-clock phases: occurrences per step, mean microseconds, ms per step.
pub fn gemm_phases(phases: &[(burn_lowp::backend::GemmPhase, f64, u64)], steps: usize) -> String {
    use std::fmt::Write as _;
    let steps = steps.max(1) as f64;
    let mut out = String::from("\n## cuBLASLt GEMM calls, wall clock (per step: calls, mean us, ms)\n");
    for (phase, mean_us, count) in phases {
        let per_step = *count as f64 / steps;
        let _ = writeln!(out, "{:>20} {per_step:8.1} {mean_us:9.1} {:9.2}", phase.name(), per_step * mean_us / 1e3);
    }
    out
}

/// Wall-clock sampling: SIGPROF sent to chosen threads at a fixed rate (see the module docs).
#[cfg(feature = "host-profile")]
mod wall {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::thread::JoinHandle;
    use std::time::{Duration, Instant};

    pub struct WallSampler {
        stop: Arc<AtomicBool>,
        thread: Option<JoinHandle<()>>,
    }

    /// CPU time a thread has used, in clock ticks (`utime + stime` of `/proc/.../stat`).
    fn cpu_ticks(task: &std::path::Path) -> Option<u64> {
        let stat = std::fs::read_to_string(task.join("stat")).ok()?;
        // The fields after the parenthesised name: state is the first, utime the 12th.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
    }

    /// The thread ids of CubeCL's device threads (named `DS<stage>-<type>-<index>`). Threads
    /// they spawn inherit the name (Linux copies it unless the spawner sets one); such a helper
    /// that never ran (parked on a channel in the first profiles) would double the thread's
    /// samples, so only threads that have used at least 50 ms of CPU count.
    fn device_threads() -> Vec<libc::pid_t> {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return Vec::new();
        };
        let min_ticks = (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64).div_ceil(20);
        tasks
            .flatten()
            .filter_map(|task| {
                let name = std::fs::read_to_string(task.path().join("comm")).ok()?;
                if !name.starts_with("DS") {
                    return None;
                }
                let tid = task.file_name().to_str()?.parse().ok()?;
                (cpu_ticks(&task.path())? >= min_ticks).then_some(tid)
            })
            .collect()
    }

    impl WallSampler {
        /// Samples the calling thread and CubeCL's device threads, `hz` times a second each.
        pub fn start(hz: u32) -> std::io::Result<Self> {
            let pid = unsafe { libc::getpid() };
            let caller = unsafe { libc::syscall(libc::SYS_gettid) } as libc::pid_t;
            let stop = Arc::new(AtomicBool::new(false));
            let stopped = stop.clone();
            let period = Duration::from_secs_f64(1.0 / hz as f64);
            let thread = std::thread::Builder::new()
                .name("wall-sampler".into())
                .spawn(move || {
                    let mut targets = vec![caller];
                    let mut listed = Instant::now();
                    let mut next = Instant::now();
                    while !stopped.load(Ordering::Relaxed) {
                        if targets.len() == 1 || listed.elapsed() > Duration::from_millis(200) {
                            targets = std::iter::once(caller).chain(device_threads()).collect();
                            listed = Instant::now();
                        }
                        // One thread at a time, spread over the period: pprof's handler drops a
                        // sample that arrives while another thread's is being recorded.
                        let slot = period / targets.len() as u32;
                        for &tid in &targets {
                            unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, libc::SIGPROF) };
                            next += slot;
                            if let Some(wait) = next.checked_duration_since(Instant::now()) {
                                std::thread::sleep(wait);
                            } else {
                                next = Instant::now();
                            }
                        }
                    }
                })?;
            Ok(Self {
                stop,
                thread: Some(thread),
            })
        }

        pub fn stop(&mut self) {
            self.stop.store(true, Ordering::Relaxed);
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
    }

    impl Drop for WallSampler {
        fn drop(&mut self) {
            self.stop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_phases_are_per_step() {
        use burn_lowp::backend::GemmPhase;
        let text = gemm_phases(&[(GemmPhase::ToDeviceThread, 250.0, 400)], 4);
        // 100 calls per step of 250 us: 25 ms per step.
        assert!(text.contains("    to_device_thread    100.0     250.0     25.00"), "{text}");
    }

    #[test]
    fn hash_suffixes_are_dropped_and_other_names_kept() {
        assert_eq!(short_name("burn::tensor::Tensor::add::h0123456789abcdef"), "burn::tensor::Tensor::add");
        assert_eq!(short_name("cuLaunchKernel"), "cuLaunchKernel");
        assert_eq!(short_name("a::hello"), "a::hello");
    }

    #[test]
    fn summary_collapses_c_leaves_onto_their_rust_caller_and_counts_inclusive_once_per_stack() {
        let stack = |functions: &[&str], samples| Stack {
            thread: "main".into(),
            functions: functions.iter().map(|s| s.to_string()).collect(),
            samples,
        };
        let stacks = [
            stack(&["memcpy", "cubecl::launch", "main::step"], 30),
            stack(&["cubecl::launch", "main::step"], 10),
            stack(&["main::recurse", "main::recurse", "main::step"], 20),
        ];
        // 60 samples at 10 Hz over 2 steps: 3 s per step.
        let text = summary(&stacks, 2, 10.0);
        assert!(text.contains("## thread main: 60 samples, 3000.00 ms per step"), "{text}");
        assert!(text.contains(" 1500.00  cubecl::launch <- memcpy"), "{text}");
        assert!(text.contains("  500.00  cubecl::launch\n"), "{text}");
        // Inclusive: main::step in every stack; the recursive frame counted once per stack.
        assert!(text.contains(" 3000.00  main::step"), "{text}");
        assert!(text.contains(" 1000.00  main::recurse"), "{text}");
        assert!(text.contains(" 2000.00  cubecl::launch\n"), "{text}");
    }
}
