//! The engine thread: one `std::thread` owns the [`Backend`] (an [`Engine`]) and runs
//! its steps; the async side talks to it over a command channel.
//!
//! Loop: while the backend has work, take every waiting command without blocking, else
//! block on the next one; run one step; route each event to its sequence's channel
//! (a failed send means the client went away, and the sequence is cancelled); publish
//! the metrics. A step that returns an error fails every running sequence with its
//! message and the loop goes on. A panic in the backend stops the thread: every open
//! channel closes (clients see an error, never a hang) and `/health` reports the error.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use nx_run::{Engine, EngineEvent, EngineMetrics, Request, RunError, SeqId};
use tokio::sync::{mpsc as tmpsc, oneshot};

use crate::error::ApiError;

/// What the engine thread drives: the [`Engine`] API. Implemented for [`Engine`];
/// tests may implement it with a scripted stand-in.
pub trait Backend: Send + 'static {
    /// [`Engine::submit`].
    fn submit(&mut self, request: Request) -> Result<SeqId, RunError>;
    /// [`Engine::step`].
    fn step(&mut self) -> Result<Vec<EngineEvent>, RunError>;
    /// [`Engine::cancel`].
    fn cancel(&mut self, seq: SeqId) -> bool;
    /// [`Engine::has_work`].
    fn has_work(&self) -> bool;
    /// [`Engine::metrics`].
    fn metrics(&self) -> EngineMetrics;
}

impl Backend for Engine {
    fn submit(&mut self, request: Request) -> Result<SeqId, RunError> {
        Engine::submit(self, request)
    }
    fn step(&mut self) -> Result<Vec<EngineEvent>, RunError> {
        Engine::step(self)
    }
    fn cancel(&mut self, seq: SeqId) -> bool {
        Engine::cancel(self, seq)
    }
    fn has_work(&self) -> bool {
        Engine::has_work(self)
    }
    fn metrics(&self) -> EngineMetrics {
        Engine::metrics(self)
    }
}

/// Where the engine thread is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineStatus {
    /// The backend is being created.
    Loading,
    /// Serving.
    Ready,
    /// Creating the backend failed, or it panicked; the message says why.
    Failed(String),
}

/// A message to the engine thread.
pub(crate) enum Command {
    /// Queue `request`; its events go to `events`, its id (or the refusal) to `answer`.
    Submit {
        request: Request,
        events: tmpsc::UnboundedSender<EngineEvent>,
        answer: oneshot::Sender<Result<SeqId, ApiError>>,
    },
    /// Drop a sequence (the client went away).
    Cancel(SeqId),
    /// Drop every sequence (shutdown after the grace period).
    CancelAll,
    /// Drop every sequence and end the thread.
    Shutdown,
}

const LOADING: u8 = 0;
const READY: u8 = 1;
const FAILED: u8 = 2;

/// State the engine thread publishes.
struct Shared {
    status: AtomicU8,
    failure: Mutex<String>,
    metrics: Mutex<EngineMetrics>,
}

impl Shared {
    fn fail(&self, message: String) {
        if let Ok(mut f) = self.failure.lock() {
            *f = message;
        }
        self.status.store(FAILED, Ordering::SeqCst);
    }
}

/// The async side's handle on the engine thread.
pub struct EngineHandle {
    tx: Sender<Command>,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

impl EngineHandle {
    /// Starts the engine thread; it creates the backend with `factory` (while
    /// [`EngineHandle::status`] is `Loading`) and then serves commands.
    pub fn spawn<B, F>(factory: F) -> std::io::Result<EngineHandle>
    where
        B: Backend,
        F: FnOnce() -> Result<B, String> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            status: AtomicU8::new(LOADING),
            failure: Mutex::new(String::new()),
            metrics: Mutex::new(EngineMetrics::default()),
        });
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("nx-engine".into())
            .spawn(move || {
                let backend = match catch_unwind(AssertUnwindSafe(factory)) {
                    Ok(Ok(b)) => b,
                    Ok(Err(e)) => return thread_shared.fail(e),
                    Err(p) => {
                        return thread_shared.fail(format!(
                            "the engine panicked while starting: {}",
                            panic_text(&p)
                        ))
                    }
                };
                engine_loop(backend, rx, &thread_shared);
            })?;
        Ok(EngineHandle {
            tx,
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Loading, ready or failed.
    pub fn status(&self) -> EngineStatus {
        match self.shared.status.load(Ordering::SeqCst) {
            LOADING => EngineStatus::Loading,
            READY => EngineStatus::Ready,
            _ => EngineStatus::Failed(
                self.shared
                    .failure
                    .lock()
                    .map(|f| f.clone())
                    .unwrap_or_else(|_| "the engine failed".into()),
            ),
        }
    }

    /// Waits (polling) until the engine is ready or has failed.
    pub async fn wait_ready(&self) -> Result<(), String> {
        loop {
            match self.status() {
                EngineStatus::Ready => return Ok(()),
                EngineStatus::Failed(e) => return Err(e),
                EngineStatus::Loading => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    }

    /// The metrics published after the last step.
    pub fn metrics(&self) -> EngineMetrics {
        self.shared.metrics.lock().map(|m| *m).unwrap_or_default()
    }

    /// Queues `request` with its events going to `events`; answers its id.
    pub(crate) async fn submit(
        &self,
        request: Request,
        events: tmpsc::UnboundedSender<EngineEvent>,
    ) -> Result<SeqId, ApiError> {
        if let EngineStatus::Failed(e) = self.status() {
            return Err(ApiError::unavailable(format!(
                "the engine is not running: {e}"
            )));
        }
        let (answer, rx) = oneshot::channel();
        self.tx
            .send(Command::Submit {
                request,
                events,
                answer,
            })
            .map_err(|_| ApiError::unavailable("the engine is not running"))?;
        match rx.await {
            Ok(r) => r,
            Err(_) => Err(ApiError::unavailable(match self.status() {
                EngineStatus::Failed(e) => format!("the engine stopped: {e}"),
                _ => "the engine stopped".to_string(),
            })),
        }
    }

    /// Cancels sequence `seq` (no-op when it has ended).
    pub(crate) fn cancel(&self, seq: SeqId) {
        let _ = self.tx.send(Command::Cancel(seq));
    }

    /// Cancels every sequence; their event channels close.
    pub fn cancel_all(&self) {
        let _ = self.tx.send(Command::CancelAll);
    }

    /// Cancels everything, ends the engine thread and waits for it.
    pub fn shutdown(&self) {
        let _ = self.tx.send(Command::Shutdown);
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        let _ = self.tx.send(Command::Shutdown);
    }
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// Per-sequence event channels.
type Routes = HashMap<SeqId, tmpsc::UnboundedSender<EngineEvent>>;

/// What handling a command asks of the loop.
enum Next {
    Go,
    Stop,
}

fn engine_loop<B: Backend>(mut backend: B, rx: Receiver<Command>, shared: &Shared) {
    let mut routes: Routes = HashMap::new();
    if let Err(p) = catch_unwind(AssertUnwindSafe(|| publish(&backend, shared))) {
        return shared.fail(format!("the engine panicked: {}", panic_text(&p)));
    }
    shared.status.store(READY, Ordering::SeqCst);
    let result = catch_unwind(AssertUnwindSafe(|| {
        run_loop(&mut backend, &rx, shared, &mut routes)
    }));
    if let Err(p) = result {
        let message = format!("the engine panicked: {}", panic_text(&p));
        for (seq, tx) in routes.drain() {
            let _ = tx.send(EngineEvent::Failed {
                seq,
                error: message.clone(),
            });
        }
        shared.fail(message);
    }
    // Dropping `rx` makes every later submit fail at once.
}

fn run_loop<B: Backend>(
    backend: &mut B,
    rx: &Receiver<Command>,
    shared: &Shared,
    routes: &mut Routes,
) {
    loop {
        // Commands: without blocking while there is work, else wait for one.
        if !backend.has_work() {
            match rx.recv() {
                Ok(cmd) => {
                    if let Next::Stop = handle(backend, routes, cmd) {
                        return;
                    }
                }
                Err(_) => return, // every handle is gone
            }
        }
        loop {
            match rx.try_recv() {
                Ok(cmd) => {
                    if let Next::Stop = handle(backend, routes, cmd) {
                        return;
                    }
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    cancel_all(backend, routes);
                    return;
                }
            }
        }
        if backend.has_work() {
            match backend.step() {
                Ok(events) => {
                    // Published before the events go out, so a client that has its
                    // answer sees metrics that include it.
                    publish(backend, shared);
                    route(backend, routes, events);
                }
                Err(e) => {
                    let message = format!("generation failed: {e}");
                    for (seq, tx) in routes.drain() {
                        backend.cancel(seq);
                        let _ = tx.send(EngineEvent::Failed {
                            seq,
                            error: message.clone(),
                        });
                    }
                }
            }
        }
        publish(backend, shared);
    }
}

fn handle<B: Backend>(backend: &mut B, routes: &mut Routes, cmd: Command) -> Next {
    match cmd {
        Command::Submit {
            request,
            events,
            answer,
        } => match backend.submit(request) {
            Ok(seq) => {
                if answer.send(Ok(seq)).is_err() {
                    // The client went away while its request was on the way.
                    backend.cancel(seq);
                } else {
                    routes.insert(seq, events);
                }
            }
            Err(e) => {
                let _ = answer.send(Err(ApiError::from_submit(&e)));
            }
        },
        Command::Cancel(seq) => {
            if routes.remove(&seq).is_some() {
                backend.cancel(seq);
            }
        }
        Command::CancelAll => cancel_all(backend, routes),
        Command::Shutdown => {
            cancel_all(backend, routes);
            return Next::Stop;
        }
    }
    Next::Go
}

fn cancel_all<B: Backend>(backend: &mut B, routes: &mut Routes) {
    for (seq, _) in routes.drain() {
        backend.cancel(seq);
    }
}

fn route<B: Backend>(backend: &mut B, routes: &mut Routes, events: Vec<EngineEvent>) {
    for event in events {
        let (seq, last) = match &event {
            EngineEvent::Token { seq, .. } | EngineEvent::PromptScores { seq, .. } => (*seq, false),
            EngineEvent::Done { seq, .. } | EngineEvent::Failed { seq, .. } => (*seq, true),
        };
        let Some(tx) = routes.get(&seq) else {
            // A sequence cancelled earlier in this step; nothing to tell.
            continue;
        };
        let sent = tx.send(event).is_ok();
        if last {
            routes.remove(&seq);
        } else if !sent {
            routes.remove(&seq);
            backend.cancel(seq);
        }
    }
}

fn publish<B: Backend>(backend: &B, shared: &Shared) {
    let m = backend.metrics();
    if let Ok(mut slot) = shared.metrics.lock() {
        *slot = m;
    }
}
