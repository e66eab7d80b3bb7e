//! A persistent worker pool: `n − 1` workers plus the calling thread share each parallel
//! loop by claiming chunks of items from an atomic counter.
//!
//! Why hand-written: a decode step runs a few hundred small matrix–vector products per
//! token, each worth only tens of microseconds. Workers therefore spin for a short while
//! after a loop ends (the next one usually arrives within microseconds) and only then
//! park, so back-to-back loops never pay a thread wake-up, while an idle process burns
//! no CPU. No thread is spawned per loop.
//!
//! Protocol (one loop at a time per pool):
//! - the caller, holding `submit`, writes the job description while no worker can read
//!   it (`open == 0` and `active == 0`), then publishes it by storing a fresh sequence
//!   number in `open` and unparks sleeping workers;
//! - a worker that sees a new number first registers in `active`, then re-checks `open`:
//!   only if the job is still open does it read the description and claim chunks;
//! - when no chunk is left the caller closes the job (`open = 0`) and waits for
//!   `active == 0`. With these four accesses, and every other modification of `open` and
//!   `active`, sequentially consistent, a worker that
//!   registers after the caller saw `active == 0` must see the job closed, so no worker
//!   touches a job (or the borrows it points to) after the call returns.

use std::any::Any;
use std::cell::UnsafeCell;
use std::ops::Range;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, TryLockError};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

/// How long an idle worker polls for the next loop before parking. Long enough to bridge
/// the serial stretches of a decode step — the RoPE rotations and cache writes between
/// the Q/K/V products and attention, and a batched step's sampling and scheduling
/// between two forward passes, 50 to 500 µs on a 2-vCPU VM — where a parked worker
/// rejoins only after a wake-up (about 150 µs there) and the calling thread starts the
/// next loop alone; short enough that a pool between requests costs nothing. At 50 µs the
/// worker of `nx bench -p 16 -n 128 -t 2 --parallel 8` (Gemma 3 270M, AMD EPYC family 25
/// model 17) parked about twice per step (333 context switches in the run, 113 at 500 µs,
/// most of those the host's preemptions); eight rounds of both binaries: +1.75 % tok/s at
/// eight streams (median of the pairs), four rounds +4 % at sixteen, one stream unchanged.
const SPIN_BEFORE_PARK: Duration = Duration::from_micros(500);

/// A loop body: `(thread slot, item range)`. The slot is 0 for the calling thread and
/// `1..n_threads` for the workers; at most one call per slot runs at a time.
type Task<'a> = dyn Fn(usize, Range<usize>) + Sync + 'a;

/// The job a fresh pool holds; never run (it has no chunks).
const NOOP: &Task<'static> = &|_, _| {};

/// One published loop. `task` points at a closure on the caller's stack whose lifetime
/// was erased; see [`ThreadPool::run_job`] for why that is sound.
#[derive(Clone, Copy)]
struct Job {
    task: *const Task<'static>,
    n_items: usize,
    chunk: usize,
    n_chunks: usize,
    /// Slots `>= n_slots` do not take part (fewer per-thread states than threads).
    n_slots: usize,
}

#[repr(align(64))]
struct Padded<T>(T);

struct Shared {
    job: UnsafeCell<Job>,
    /// Sequence number of the open job, 0 when none is open.
    open: AtomicUsize,
    next_chunk: AtomicUsize,
    /// Workers currently registered on a job (they may read it).
    active: Padded<AtomicUsize>,
    panicked: AtomicBool,
    panic_payload: Mutex<Option<Box<dyn Any + Send>>>,
    /// `sleeping[i]`: worker slot `i + 1` is parked or about to park.
    sleeping: Box<[Padded<AtomicBool>]>,
    shutdown: AtomicBool,
}

// SAFETY: `job` is the only non-Sync field. It is written only by the thread holding the
// pool's `submit` lock while `open == 0` and `active == 0`, and read only by threads that
// registered in `active` and then saw `open` equal to the published sequence number (see
// the module comment), so reads and writes never overlap. The raw task pointer inside is
// dereferenced only while the publishing call is blocked, keeping its referent alive;
// the referent is `Sync`.
unsafe impl Sync for Shared {}
// SAFETY: as above; nothing in `Shared` is tied to the thread that created it.
unsafe impl Send for Shared {}

/// A fixed set of worker threads that run parallel loops with the calling thread.
///
/// Every loop call blocks until all of its chunks are done, so closures may borrow from
/// the caller's stack. A panic inside a chunk is caught, the remaining chunks are
/// abandoned, and the panic is resumed on the calling thread once every worker has left
/// the loop. A pool runs one loop at a time: a loop started while another runs on the
/// same pool (from a second thread, or nested inside a chunk) runs serially on its
/// calling thread instead of waiting, which cannot deadlock.
pub struct ThreadPool {
    n_threads: usize,
    shared: Arc<Shared>,
    /// Held while a loop is published; holds the last sequence number used.
    submit: Mutex<usize>,
    threads: Vec<Thread>,
    handles: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("n_threads", &self.n_threads)
            .finish()
    }
}

/// The thread count the environment asks for: `NX_THREADS` when it is a positive
/// integer, otherwise the number of CPUs this process may use (1 if unknown).
pub fn threads_from_env() -> usize {
    std::env::var("NX_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| thread::available_parallelism().map_or(1, |n| n.get()))
}

impl ThreadPool {
    /// A pool of `n_threads` threads in all: the caller plus `n_threads − 1` workers.
    /// `0` is treated as `1`. A pool of one runs every loop inline with no overhead. If
    /// the system refuses to spawn a worker, the pool keeps the ones it has (see
    /// [`ThreadPool::n_threads`]).
    pub fn new(n_threads: usize) -> ThreadPool {
        let want_workers = n_threads.max(1) - 1;
        let shared = Arc::new(Shared {
            job: UnsafeCell::new(Job {
                task: NOOP as *const Task<'static>,
                n_items: 0,
                chunk: 1,
                n_chunks: 0,
                n_slots: 0,
            }),
            open: AtomicUsize::new(0),
            next_chunk: AtomicUsize::new(0),
            active: Padded(AtomicUsize::new(0)),
            panicked: AtomicBool::new(false),
            panic_payload: Mutex::new(None),
            sleeping: (0..want_workers)
                .map(|_| Padded(AtomicBool::new(false)))
                .collect(),
            shutdown: AtomicBool::new(false),
        });
        let mut handles = Vec::with_capacity(want_workers);
        for i in 0..want_workers {
            let worker_shared = Arc::clone(&shared);
            let spawned = thread::Builder::new()
                .name(format!("nx-worker-{}", i + 1))
                .spawn(move || worker_loop(&worker_shared, i + 1));
            match spawned {
                Ok(h) => handles.push(h),
                Err(_) => break,
            }
        }
        let threads = handles.iter().map(|h| h.thread().clone()).collect();
        ThreadPool {
            n_threads: handles.len() + 1,
            shared,
            submit: Mutex::new(0),
            threads,
            handles,
        }
    }

    /// The process-wide pool, created on first use with [`threads_from_env`] threads.
    pub fn global() -> Arc<ThreadPool> {
        static GLOBAL: OnceLock<Arc<ThreadPool>> = OnceLock::new();
        Arc::clone(GLOBAL.get_or_init(|| Arc::new(ThreadPool::new(threads_from_env()))))
    }

    /// Threads that run a loop, the caller included.
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Calls `f` on consecutive ranges of at most `chunk` items covering `0..n_items`,
    /// spread over the pool's threads; returns when all are done. `chunk == 0` is
    /// treated as 1. Which thread runs which range is unspecified, so `f` must give the
    /// same result wherever it runs.
    pub fn parallel_for<F>(&self, n_items: usize, chunk: usize, f: F)
    where
        F: Fn(Range<usize>) + Sync,
    {
        self.run_job(n_items, chunk, self.n_threads, &|_, r| f(r));
    }

    /// [`ThreadPool::parallel_for`] with per-thread mutable state: each call gets
    /// exclusive use of one element of `states` for its duration (scratch buffers).
    /// Uses at most `states.len()` threads.
    ///
    /// # Panics
    /// If `n_items > 0` and `states` is empty.
    pub fn parallel_for_with<S, F>(&self, n_items: usize, chunk: usize, states: &mut [S], f: F)
    where
        S: Send,
        F: Fn(&mut S, Range<usize>) + Sync,
    {
        if n_items == 0 {
            return;
        }
        assert!(
            !states.is_empty(),
            "parallel_for_with: no per-thread state given"
        );
        let n_slots = states.len().min(self.n_threads);
        let base = SendPtr(states.as_mut_ptr());
        self.run_job(n_items, chunk, n_slots, &|slot, r| {
            // SAFETY: `slot < n_slots <= states.len()`, and the pool runs at most one
            // call per slot at a time (each slot belongs to one thread, which runs its
            // chunks one after another), so this is the only live reference to
            // `states[slot]`. `states` stays mutably borrowed until the loop is done.
            let s = unsafe { &mut *base.get().add(slot) };
            f(s, r)
        });
    }

    /// Splits `data` into items of `item_len` elements and calls `f(state, items, part)`
    /// for consecutive ranges of at most `chunk` items, `part` being those items' elements
    /// (`items.len() · item_len` of them). Per-thread `states` as in
    /// [`ThreadPool::parallel_for_with`].
    ///
    /// # Panics
    /// If `item_len == 0`, if `data.len()` is not a multiple of `item_len`, or if `data` is
    /// not empty and `states` is.
    pub fn parallel_chunks_mut<T, S, F>(
        &self,
        data: &mut [T],
        item_len: usize,
        chunk: usize,
        states: &mut [S],
        f: F,
    ) where
        T: Send,
        S: Send,
        F: Fn(&mut S, Range<usize>, &mut [T]) + Sync,
    {
        self.chunks_mut(data, item_len, chunk, states, false, f)
    }

    /// [`ThreadPool::parallel_chunks_mut`] handing out the last items first, for loops
    /// whose later items cost more (attention under the causal mask): the costliest
    /// chunks start first and the cheap ones fill the gaps at the end, instead of one
    /// thread finishing the most expensive chunk alone while the others wait.
    pub fn parallel_chunks_mut_from_end<T, S, F>(
        &self,
        data: &mut [T],
        item_len: usize,
        chunk: usize,
        states: &mut [S],
        f: F,
    ) where
        T: Send,
        S: Send,
        F: Fn(&mut S, Range<usize>, &mut [T]) + Sync,
    {
        self.chunks_mut(data, item_len, chunk, states, true, f)
    }

    fn chunks_mut<T, S, F>(
        &self,
        data: &mut [T],
        item_len: usize,
        chunk: usize,
        states: &mut [S],
        from_end: bool,
        f: F,
    ) where
        T: Send,
        S: Send,
        F: Fn(&mut S, Range<usize>, &mut [T]) + Sync,
    {
        assert!(item_len > 0, "parallel_chunks_mut: item_len is 0");
        assert!(
            data.len().is_multiple_of(item_len),
            "parallel_chunks_mut: {} elements are not a whole number of items of {item_len}",
            data.len()
        );
        let n_items = data.len() / item_len;
        let base = SendPtr(data.as_mut_ptr());
        self.parallel_for_with(n_items, chunk, states, |s, r| {
            // Mirrored, the ranges stay disjoint and within `0..n_items`.
            let r = if from_end {
                n_items - r.end..n_items - r.start
            } else {
                r
            };
            // SAFETY: the ranges handed out are disjoint and within `0..n_items`, so the
            // element ranges `r.start·item_len .. r.end·item_len` are disjoint parts of
            // `data`, which stays mutably borrowed until the loop is done.
            let part = unsafe {
                std::slice::from_raw_parts_mut(
                    base.get().add(r.start * item_len),
                    r.len() * item_len,
                )
            };
            f(s, r, part)
        });
    }

    fn run_job(&self, n_items: usize, chunk: usize, n_slots: usize, task: &Task<'_>) {
        let chunk = chunk.max(1);
        let n_chunks = n_items.div_ceil(chunk);
        let run_inline = || {
            for c in 0..n_chunks {
                task(0, c * chunk..((c + 1) * chunk).min(n_items));
            }
        };
        if n_chunks <= 1 || n_slots <= 1 || self.handles.is_empty() {
            return run_inline();
        }
        let mut seq = match self.submit.try_lock() {
            Ok(g) => g,
            // Another loop is running on this pool (nested, or from another thread):
            // waiting for it could deadlock, running serially cannot.
            Err(TryLockError::WouldBlock) => return run_inline(),
            // A previous loop's task panicked while the lock was held; the pool's state
            // was restored before the panic resumed, so the lock's data is still valid.
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
        };
        let sh = &*self.shared;
        *seq = match seq.wrapping_add(1) {
            0 => 1,
            s => s,
        };
        // SAFETY: erasing the lifetime of `task` is sound because this function does not
        // return (nor unwind: panics inside tasks are caught) before the job is closed and
        // `active` has dropped to 0, after which no worker dereferences the pointer.
        let task_static = unsafe {
            std::mem::transmute::<*const Task<'_>, *const Task<'static>>(task as *const _)
        };
        let job = Job {
            task: task_static,
            n_items,
            chunk,
            n_chunks,
            n_slots,
        };
        // SAFETY: we hold `submit`, the previous job was closed (`open == 0`) and we saw
        // `active == 0` after closing it, so no thread reads `job` now (see `Shared`).
        unsafe { *sh.job.get() = job };
        sh.next_chunk.store(0, Ordering::Relaxed);
        sh.panicked.store(false, Ordering::Relaxed);
        // Publishing: the SeqCst store releases the writes above to workers that see it.
        sh.open.store(*seq, Ordering::SeqCst);
        for (flag, t) in sh.sleeping.iter().zip(&self.threads).take(n_slots - 1) {
            if flag.0.load(Ordering::SeqCst) {
                t.unpark();
            }
        }
        run_chunks(sh, &job, 0);
        // Close and wait for every registered worker to leave.
        sh.open.store(0, Ordering::SeqCst);
        let mut spins = 0u32;
        while sh.active.0.load(Ordering::SeqCst) != 0 {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) {
                // A worker was descheduled mid-chunk; let it run.
                thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        let payload = if sh.panicked.load(Ordering::Relaxed) {
            lock_ignoring_poison(&sh.panic_payload).take()
        } else {
            None
        };
        drop(seq);
        if let Some(p) = payload {
            resume_unwind(p);
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        for t in &self.threads {
            t.unpark();
        }
        for h in self.handles.drain(..) {
            // A worker never panics (task panics are caught), so join errors are moot.
            let _ = h.join();
        }
    }
}

/// A raw pointer that may cross threads; users uphold exclusivity themselves.
struct SendPtr<T>(*mut T);

impl<T> SendPtr<T> {
    /// Taking the pointer through a method makes closures capture the whole wrapper (and
    /// its `Sync` impl) rather than the bare pointer field.
    fn get(&self) -> *mut T {
        self.0
    }
}

// SAFETY: only used to hand disjoint elements of a `&mut [T]` (T: Send) to pool threads;
// the call sites document why the accesses never overlap.
unsafe impl<T: Send> Sync for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for SendPtr<T> {}

fn lock_ignoring_poison<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Claims and runs chunks of `job` until none is left or a chunk panicked.
fn run_chunks(sh: &Shared, job: &Job, slot: usize) {
    if slot >= job.n_slots {
        return;
    }
    // SAFETY: the caller registered this thread for the job (or is the publishing
    // thread), so the closure behind `task` is alive until we deregister.
    let task = unsafe { &*job.task };
    while !sh.panicked.load(Ordering::Relaxed) {
        let c = sh.next_chunk.fetch_add(1, Ordering::Relaxed);
        if c >= job.n_chunks {
            break;
        }
        let start = c * job.chunk;
        let end = (start + job.chunk).min(job.n_items);
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| task(slot, start..end))) {
            let mut slot_payload = lock_ignoring_poison(&sh.panic_payload);
            if slot_payload.is_none() {
                *slot_payload = Some(p);
            }
            sh.panicked.store(true, Ordering::Relaxed);
            break;
        }
    }
}

fn worker_loop(sh: &Shared, slot: usize) {
    let mut last_seen = 0usize;
    let sleeping = &sh.sleeping[slot - 1].0;
    loop {
        // Wait for a job we have not joined yet: spin first, then park.
        let mut spin_start = Instant::now();
        let mut spins = 0u32;
        let seq = loop {
            if sh.shutdown.load(Ordering::Acquire) {
                return;
            }
            let s = sh.open.load(Ordering::Acquire);
            if s != 0 && s != last_seen {
                break s;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(64) || spin_start.elapsed() < SPIN_BEFORE_PARK {
                std::hint::spin_loop();
                continue;
            }
            // Announce the nap, then look once more: either the publisher sees the flag
            // and unparks us, or we see its job here (both sides use SeqCst).
            sleeping.store(true, Ordering::SeqCst);
            let s = sh.open.load(Ordering::SeqCst);
            if (s == 0 || s == last_seen) && !sh.shutdown.load(Ordering::SeqCst) {
                thread::park();
            }
            sleeping.store(false, Ordering::SeqCst);
            spin_start = Instant::now();
        };
        last_seen = seq;
        sh.active.0.fetch_add(1, Ordering::SeqCst);
        if sh.open.load(Ordering::SeqCst) == seq {
            // SAFETY: registered in `active` and saw the job still open, so the publisher
            // finished writing it and will not write again until we deregister.
            let job = unsafe { *sh.job.get() };
            run_chunks(sh, &job, slot);
        }
        // SeqCst, not just AcqRel: it releases this worker's writes (the chunk outputs)
        // to the publisher's load that sees `active == 0`, and it keeps every
        // modification of `active` in the single total order. With a weaker decrement,
        // C++20 lets the publisher's SeqCst load read a stale 0 from it even after a
        // later registration (a SeqCst load may return a non-SeqCst store that precedes
        // the latest SeqCst one), which breaks the close/register handshake above;
        // Miri's data-race checker reported exactly that.
        sh.active.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_item_runs_exactly_once() {
        for threads in 1..=4 {
            let pool = ThreadPool::new(threads);
            for (n_items, chunk) in [(0, 3), (1, 1), (7, 3), (100, 1), (1000, 64), (5, 0)] {
                let hits: Vec<AtomicUsize> = (0..n_items).map(|_| AtomicUsize::new(0)).collect();
                pool.parallel_for(n_items, chunk, |r| {
                    assert!(r.len() <= chunk.max(1) && !r.is_empty());
                    for i in r {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    }
                });
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                    "threads {threads}, n {n_items}, chunk {chunk}"
                );
            }
        }
    }

    #[test]
    fn many_back_to_back_loops_see_all_writes() {
        let pool = ThreadPool::new(3);
        let mut data = vec![0u64; 257];
        let mut states = vec![(); 3];
        // Miri emulates every thread switch; a few rounds still check the hand-offs.
        let rounds = if cfg!(miri) { 20 } else { 2000u64 };
        for round in 1..=rounds {
            pool.parallel_chunks_mut(&mut data, 1, 8, &mut states, |_, r, part| {
                for (i, v) in r.zip(part.iter_mut()) {
                    *v += round * i as u64;
                }
            });
            // Every write of the loop is visible as soon as it returns.
            let sum: u64 = data.iter().sum();
            let per_round: u64 = (0..257u64).sum();
            assert_eq!(sum, per_round * round * (round + 1) / 2);
        }
    }

    #[test]
    fn chunks_from_the_end_cover_every_item_with_its_own_elements() {
        for threads in 1..=3 {
            let pool = ThreadPool::new(threads);
            let mut states = vec![(); threads];
            for (n_items, chunk) in [(0, 3), (1, 1), (7, 3), (100, 7), (64, 8)] {
                // Items of 3 elements; each chunk writes its item indices into its part.
                let mut data = vec![usize::MAX; 3 * n_items];
                pool.parallel_chunks_mut_from_end(&mut data, 3, chunk, &mut states, |_, r, p| {
                    assert!(r.len() <= chunk.max(1) && p.len() == 3 * r.len());
                    for (i, item) in r.zip(p.chunks_exact_mut(3)) {
                        item.fill(i);
                    }
                });
                let want: Vec<usize> = (0..n_items).flat_map(|i| [i; 3]).collect();
                assert_eq!(data, want, "threads {threads}, n {n_items}, chunk {chunk}");
            }
        }
    }

    #[test]
    fn per_thread_states_are_exclusive() {
        let pool = ThreadPool::new(4);
        // Each state counts the items its holder ran; a shared state would lose updates
        // only through a data race, so instead check the totals and that every state
        // index used exists.
        let mut states = vec![0usize; 4];
        pool.parallel_for_with(10_000, 7, &mut states, |s, r| *s += r.len());
        assert_eq!(states.iter().sum::<usize>(), 10_000);

        // Fewer states than threads: only that many threads take part.
        let mut two = vec![0usize; 2];
        pool.parallel_for_with(1_000, 3, &mut two, |s, r| *s += r.len());
        assert_eq!(two.iter().sum::<usize>(), 1_000);
    }

    #[test]
    fn work_is_shared_across_threads() {
        let pool = ThreadPool::new(2);
        let mut per_thread = vec![0usize; 2];
        // Chunks slow enough that the worker wakes up and claims some.
        pool.parallel_for_with(64, 1, &mut per_thread, |s, _| {
            thread::sleep(Duration::from_millis(2));
            *s += 1;
        });
        assert_eq!(per_thread.iter().sum::<usize>(), 64);
        assert!(per_thread[1] > 0, "the worker never ran: {per_thread:?}");
    }

    #[test]
    fn panic_in_a_task_propagates_and_pool_survives() {
        let pool = ThreadPool::new(3);
        for _ in 0..20 {
            let r = catch_unwind(AssertUnwindSafe(|| {
                pool.parallel_for(100, 1, |r| {
                    if r.start == 57 {
                        panic!("boom at 57");
                    }
                    thread::sleep(Duration::from_micros(50));
                })
            }));
            let msg = r.expect_err("the panic must reach the caller");
            assert_eq!(msg.downcast_ref::<&str>(), Some(&"boom at 57"));
        }
        // Still usable afterwards.
        let total = AtomicU64::new(0);
        pool.parallel_for(1000, 10, |r| {
            total.fetch_add(r.len() as u64, Ordering::Relaxed);
        });
        assert_eq!(total.load(Ordering::Relaxed), 1000);
    }

    #[test]
    fn nested_loops_run_serially_instead_of_deadlocking() {
        let pool = ThreadPool::new(2);
        let total = AtomicU64::new(0);
        pool.parallel_for(8, 1, |_| {
            pool.parallel_for(10, 3, |r| {
                total.fetch_add(r.len() as u64, Ordering::Relaxed);
            });
        });
        assert_eq!(total.load(Ordering::Relaxed), 80);
    }

    #[test]
    fn concurrent_callers_share_one_pool() {
        let pool = Arc::new(ThreadPool::new(2));
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let pool = Arc::clone(&pool);
                thread::spawn(move || {
                    for _ in 0..200 {
                        let total = AtomicU64::new(0);
                        pool.parallel_for(50, 4, |r| {
                            total.fetch_add(r.len() as u64, Ordering::Relaxed);
                        });
                        assert_eq!(total.load(Ordering::Relaxed), 50);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn workers_wake_after_parking() {
        let pool = ThreadPool::new(2);
        for _ in 0..5 {
            // Longer than the spin window: the worker parks in between.
            thread::sleep(Duration::from_millis(3));
            let mut per_thread = vec![0usize; 2];
            pool.parallel_for_with(40, 1, &mut per_thread, |s, _| {
                thread::sleep(Duration::from_millis(1));
                *s += 1;
            });
            assert_eq!(per_thread.iter().sum::<usize>(), 40);
            assert!(per_thread[1] > 0, "parked worker was not woken");
        }
    }

    #[test]
    fn zero_and_one_thread_pools_run_inline() {
        for n in [0, 1] {
            let pool = ThreadPool::new(n);
            assert_eq!(pool.n_threads(), 1);
            let me = thread::current().id();
            pool.parallel_for(10, 1, |_| assert_eq!(thread::current().id(), me));
        }
    }
}
