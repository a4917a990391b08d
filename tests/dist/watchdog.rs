//! The watchdog with fake events, and the fault state it raises.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use burn_lowp::dist::watchdog::{Completion, Watchdog};
use burn_lowp::dist::FaultState;

struct Flag(Arc<AtomicBool>);

impl Completion for Flag {
    fn is_complete(&mut self) -> Result<bool, String> {
        Ok(self.0.load(Ordering::Acquire))
    }
}

fn flag() -> (Arc<AtomicBool>, Box<dyn Completion>) {
    let f = Arc::new(AtomicBool::new(false));
    (f.clone(), Box::new(Flag(f)))
}

fn wait_until(what: &str, within: Duration, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn finished_collectives_are_retired_in_order() {
    let fault = FaultState::new(0, None);
    let dog = Watchdog::start(Duration::from_secs(10), Duration::from_millis(1), fault.clone()).unwrap();
    let (a, done_a) = flag();
    let (b, done_b) = flag();
    dog.watch("all-reduce of bucket 0", done_a);
    dog.watch("all-reduce of bucket 1", done_b);
    // The second finishing first retires nothing: a stream runs its work in order.
    b.store(true, Ordering::Release);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(dog.outstanding(), 2);
    a.store(true, Ordering::Release);
    wait_until("retired", Duration::from_secs(2), || dog.outstanding() == 0);
    assert!(!fault.is_raised());
}

#[test]
fn a_collective_that_never_finishes_raises_and_runs_the_hooks() {
    let fault = FaultState::new(1, None);
    let aborted = Arc::new(AtomicUsize::new(0));
    {
        let aborted = aborted.clone();
        fault.on_fault(move |_| {
            aborted.fetch_add(1, Ordering::AcqRel);
        });
    }
    let dog = Watchdog::start(Duration::from_millis(100), Duration::from_millis(5), fault.clone()).unwrap();
    let (_never, done) = flag();
    let start = Instant::now();
    dog.watch("all-to-all of layer 3", done);
    wait_until("fault", Duration::from_secs(2), || fault.is_raised());
    assert!(start.elapsed() >= Duration::from_millis(100));
    let e = fault.check().unwrap_err().to_string();
    assert!(e.contains("all-to-all of layer 3 has not completed") && e.contains("timeout 100ms"), "{e}");
    // A second fault changes nothing; the hooks ran once.
    fault.raise("later");
    assert_eq!(aborted.load(Ordering::Acquire), 1);
    assert!(fault.check().unwrap_err().to_string().contains("layer 3"));
}

#[test]
fn a_probe_reports_an_asynchronous_error() {
    let fault = FaultState::new(0, None);
    let dog = Watchdog::start(Duration::from_secs(10), Duration::from_millis(1), fault.clone()).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    {
        let calls = calls.clone();
        dog.add_probe(Box::new(move || {
            (calls.fetch_add(1, Ordering::AcqRel) >= 3).then(|| "NCCL: remote process exited".to_string())
        }));
    }
    wait_until("probe fault", Duration::from_secs(2), || fault.is_raised());
    assert_eq!(fault.check().unwrap_err().to_string(), "distributed run: NCCL: remote process exited");
}

#[test]
fn a_hook_added_after_the_fault_runs_at_once() {
    let fault = FaultState::new(0, None);
    assert!(fault.check().is_ok());
    fault.raise("first");
    let seen = Arc::new(std::sync::Mutex::new(String::new()));
    {
        let seen = seen.clone();
        fault.on_fault(move |m| *seen.lock().unwrap() = m.to_string());
    }
    assert_eq!(*seen.lock().unwrap(), "first");
}
