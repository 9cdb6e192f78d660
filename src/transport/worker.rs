//! Background threads for the slow verbs work that must not block the event loop.
//! Each runs its jobs in order. Without its thread (it could not be started), a job
//! runs where it is submitted.
//!
//! - [`PREPARE`] registers larger RX buffers (docs/protocol.md §4.3, adaptive RX
//!   window); a result goes back through the job's own [`Slot`], which the connection
//!   collects at its next read.
//! - [`RELEASE`] tears down closed connections (docs/server-abi.md §4.4): destroy the
//!   QP, disconnect, destroy the id, deregister the buffers, free the protection
//!   domain. Under Soft-RoCE that is milliseconds a connection, which thousands of
//!   clients leaving at once took from the event loop in one turn when it ran there.
//!   Apart from [`PREPARE`], so that a mass close does not hold up the buffers of the
//!   clients that stay.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

type Job = Box<dyn FnOnce() + Send>;

/// One background thread, started at its first job.
pub(crate) struct Worker {
    name: &'static str,
    jobs: OnceLock<Option<Mutex<Sender<Job>>>>,
}

/// The module's background threads.
pub(crate) struct Workers {
    /// Registers larger RX buffers.
    pub(crate) prepare: Worker,
    /// Releases the verbs resources of closed connections.
    pub(crate) release: Worker,
}

impl Workers {
    pub(crate) const fn new() -> Workers {
        Workers { prepare: Worker::new("rdma-prepare"), release: Worker::new("rdma-release") }
    }
}

impl Worker {
    const fn new(name: &'static str) -> Worker {
        Worker { name, jobs: OnceLock::new() }
    }

    fn start(&self) -> Option<Mutex<Sender<Job>>> {
        let (tx, rx) = channel::<Job>();
        let spawned = std::thread::Builder::new().name(self.name.into()).spawn(move || {
            for job in rx {
                // A panic in one job (a bug) must not end the thread for the others.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            }
        });
        match spawned {
            Ok(_) => Some(Mutex::new(tx)),
            Err(e) => {
                log::warn!("RDMA: no background thread {} ({e}); its work runs on the event loop", self.name);
                None
            }
        }
    }

    /// Runs `job` on this thread (or here, if there is none).
    pub(crate) fn submit(&self, job: impl FnOnce() + Send + 'static) {
        let job: Job = Box::new(job);
        let job = match self.jobs.get_or_init(|| self.start()) {
            Some(tx) => match tx.lock().send(job) {
                Ok(()) => return,
                Err(returned) => returned.0,
            },
            None => job,
        };
        job();
    }
}

/// Where a job leaves its result for the submitter to collect.
pub(crate) struct Slot<T>(Arc<Mutex<Option<T>>>);

impl<T: Send + 'static> Slot<T> {
    /// Runs `make` on `worker`; its result waits in the slot.
    pub(crate) fn spawn(worker: &Worker, make: impl FnOnce() -> T + Send + 'static) -> Slot<T> {
        let slot = Arc::new(Mutex::new(None));
        let out = Arc::clone(&slot);
        worker.submit(move || {
            let v = make();
            *out.lock() = Some(v);
        });
        Slot(slot)
    }

    /// The result, once the job has finished.
    pub(crate) fn take(&self) -> Option<T> {
        self.0.lock().take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_slot_receives_the_jobs_result_from_the_background_thread() {
        let here = std::thread::current().id();
        let slot = Slot::spawn(&crate::transport::MODULE.workers.prepare, move || std::thread::current().id() != here);
        let t0 = Instant::now();
        let ran_elsewhere = loop {
            if let Some(v) = slot.take() {
                break v;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "the job never finished");
            std::thread::sleep(Duration::from_millis(1));
        };
        assert!(ran_elsewhere, "the job ran on the submitting thread");
        assert!(slot.take().is_none(), "a result is taken once");
    }

    #[test]
    fn a_panicking_job_does_not_stop_the_ones_after_it() {
        crate::transport::MODULE.workers.release.submit(|| panic!("a job that fails"));
        let slot = Slot::spawn(&crate::transport::MODULE.workers.release, || 42);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if let Some(v) = slot.take() {
                assert_eq!(v, 42);
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("the job after a panicking one never ran");
    }
}
