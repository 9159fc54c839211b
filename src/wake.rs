//! Two futures that change how a task is woken.
//!
//! [`Gated`]: a future polled only when it was woken itself. A connection's or a call's task
//! waits on its work and, beside it, on a rare event (the listener stopping, the run being
//! cancelled) in one `select!`. The task is woken several times per request by its sockets, and
//! `select!` polls every branch at every wake; polling a watch or `Notify` future is a lock each
//! time. [`Gated`] gives the inner future a waker of its own and polls it only after that waker
//! fired (and on the first poll, which registers it), so the task's other wakes cost one atomic
//! swap.
//!
//! [`Inline`]: a future that is polled again at once when it wakes itself while being polled.
//! hyper's server reads a request body through a channel whose two ends live in the same
//! connection task: taking the body wakes the sending end, that is, the task itself. A task
//! woken while it runs is put back on the scheduler's queue as if it had yielded, and the
//! multi-threaded runtime wakes a parked worker to take it: a futex wake, a thread switch and
//! the task moving to another core, once per request. [`Inline`] notes such a wake and polls
//! the inner future again in the same poll instead (at most [`REPOLLS`] times; past that it
//! yields as before, so a future that keeps waking itself still gives way). A wake that comes
//! while it is not being polled goes to the task as usual.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use atomic_waker::AtomicWaker;

pin_project_lite::pin_project! {
    /// `inner`, polled only after its own waker fired; see the module's comment.
    pub struct Gated<F> {
        #[pin]
        inner: F,
        signal: Arc<Signal>,
        // `signal` as a waker, made once.
        waker: Waker,
    }
}

/// Set by the inner future's waker; wakes the task that polls the [`Gated`].
struct Signal {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl<F: Future> Gated<F> {
    pub fn new(inner: F) -> Gated<F> {
        let signal = Arc::new(Signal {
            // The first poll polls `inner`, which hands it its waker.
            woken: AtomicBool::new(true),
            task: AtomicWaker::new(),
        });
        Gated {
            inner,
            waker: Waker::from(signal.clone()),
            signal,
        }
    }
}

impl<F: Future> Future for Gated<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        // Registered before the flag is read, so a wake between the two is not lost.
        this.signal.task.register(cx.waker());
        if !this.signal.woken.swap(false, Ordering::Acquire) {
            return Poll::Pending;
        }
        this.inner.poll(&mut Context::from_waker(this.waker))
    }
}

/// How many times [`Inline`] polls its future again within one poll of its own.
pub const REPOLLS: usize = 8;

/// [`Relay`] state: the inner future is being polled.
const POLLING: u8 = 1;
/// [`Relay`] state: the inner future was woken while being polled.
const WOKEN: u8 = 2;

pin_project_lite::pin_project! {
    /// `inner`, polled again at once when it wakes itself during its poll; see the module's
    /// comment.
    pub struct Inline<F> {
        #[pin]
        inner: F,
        relay: Arc<Relay>,
        // `relay` as a waker, made once.
        waker: Waker,
    }
}

/// The inner future's waker: a wake during its poll is noted, any other goes to the task.
struct Relay {
    state: AtomicU8,
    task: AtomicWaker,
}

impl Wake for Relay {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.state.fetch_or(WOKEN, Ordering::AcqRel) & POLLING == 0 {
            self.task.wake();
        }
    }
}

impl<F: Future> Inline<F> {
    pub fn new(inner: F) -> Inline<F> {
        let relay = Arc::new(Relay {
            state: AtomicU8::new(0),
            task: AtomicWaker::new(),
        });
        Inline {
            inner,
            waker: Waker::from(relay.clone()),
            relay,
        }
    }
}

impl<F: Future> Future for Inline<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let mut this = self.project();
        // Registered before the inner poll, so a wake after it is not lost.
        this.relay.task.register(cx.waker());
        let mut inner_cx = Context::from_waker(this.waker);
        for _ in 0..REPOLLS {
            this.relay.state.store(POLLING, Ordering::Release);
            let poll = this.inner.as_mut().poll(&mut inner_cx);
            // A wake from here on finds POLLING clear and goes to the task.
            let woken = this.relay.state.swap(0, Ordering::AcqRel) & WOKEN != 0;
            if poll.is_ready() || !woken {
                return poll;
            }
        }
        // Still waking itself: give way, as the plain self-wake would have.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts its polls; ready once `open` is set, and wakes its waker when told.
    struct Door {
        polls: Arc<AtomicUsize>,
        open: Arc<AtomicBool>,
        waker: Arc<std::sync::Mutex<Option<Waker>>>,
    }

    impl Future for Door {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::SeqCst);
            if self.open.load(Ordering::SeqCst) {
                return Poll::Ready(());
            }
            *self.waker.lock().unwrap() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    #[test]
    fn the_inner_future_is_polled_only_after_its_own_wake() {
        let polls = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicBool::new(false));
        let inner_waker = Arc::new(std::sync::Mutex::new(None::<Waker>));
        let mut gated = Box::pin(Gated::new(Door {
            polls: polls.clone(),
            open: open.clone(),
            waker: inner_waker.clone(),
        }));
        let task_wakes = Arc::new(Counter::default());
        let task_waker = Waker::from(task_wakes.clone());
        let mut cx = Context::from_waker(&task_waker);

        assert!(gated.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 1, "the first poll polls it");
        for _ in 0..5 {
            assert!(gated.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(
            polls.load(Ordering::SeqCst),
            1,
            "other wakes do not poll it"
        );

        open.store(true, Ordering::SeqCst);
        let w = inner_waker.lock().unwrap().take().unwrap();
        w.wake();
        assert_eq!(
            task_wakes.0.load(Ordering::SeqCst),
            1,
            "its wake wakes the task"
        );
        assert!(gated.as_mut().poll(&mut cx).is_ready());
        assert_eq!(polls.load(Ordering::SeqCst), 2);
    }

    /// Wakes its own waker during each of its first `self_wakes` polls; ready after `ready_at`
    /// polls. Keeps its last waker.
    struct Selfish {
        polls: Arc<AtomicUsize>,
        self_wakes: usize,
        ready_at: usize,
        waker: Arc<std::sync::Mutex<Option<Waker>>>,
    }

    impl Future for Selfish {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            let n = self.polls.fetch_add(1, Ordering::SeqCst) + 1;
            if n >= self.ready_at {
                return Poll::Ready(());
            }
            *self.waker.lock().unwrap() = Some(cx.waker().clone());
            if n <= self.self_wakes {
                cx.waker().wake_by_ref();
            }
            Poll::Pending
        }
    }

    fn selfish(
        self_wakes: usize,
        ready_at: usize,
    ) -> (
        Selfish,
        Arc<AtomicUsize>,
        Arc<std::sync::Mutex<Option<Waker>>>,
    ) {
        let polls = Arc::new(AtomicUsize::new(0));
        let waker = Arc::new(std::sync::Mutex::new(None::<Waker>));
        let f = Selfish {
            polls: polls.clone(),
            self_wakes,
            ready_at,
            waker: waker.clone(),
        };
        (f, polls, waker)
    }

    #[test]
    fn a_wake_during_its_own_poll_is_a_second_poll_not_a_wake_of_the_task() {
        let (f, polls, _) = selfish(1, usize::MAX);
        let mut inline = Box::pin(Inline::new(f));
        let task_wakes = Arc::new(Counter::default());
        let task_waker = Waker::from(task_wakes.clone());
        let mut cx = Context::from_waker(&task_waker);

        assert!(inline.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 2, "polled again at once");
        assert_eq!(
            task_wakes.0.load(Ordering::SeqCst),
            0,
            "the task is not woken"
        );

        // The same wake-then-ready within one poll is ready at once.
        let (f, polls, _) = selfish(1, 2);
        let mut inline = Box::pin(Inline::new(f));
        assert!(inline.as_mut().poll(&mut cx).is_ready());
        assert_eq!(polls.load(Ordering::SeqCst), 2);
        assert_eq!(task_wakes.0.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_wake_outside_its_poll_wakes_the_task() {
        let (f, polls, inner_waker) = selfish(0, 2);
        let mut inline = Box::pin(Inline::new(f));
        let task_wakes = Arc::new(Counter::default());
        let task_waker = Waker::from(task_wakes.clone());
        let mut cx = Context::from_waker(&task_waker);

        assert!(inline.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 1);
        let w = inner_waker.lock().unwrap().clone().unwrap();
        w.wake_by_ref();
        assert_eq!(
            task_wakes.0.load(Ordering::SeqCst),
            1,
            "its wake wakes the task"
        );
        // From another thread too.
        std::thread::spawn(move || w.wake()).join().unwrap();
        assert!(task_wakes.0.load(Ordering::SeqCst) >= 1);
        assert!(inline.as_mut().poll(&mut cx).is_ready());
        assert_eq!(polls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_future_that_keeps_waking_itself_still_gives_way() {
        let (f, polls, _) = selfish(usize::MAX, usize::MAX);
        let mut inline = Box::pin(Inline::new(f));
        let task_wakes = Arc::new(Counter::default());
        let task_waker = Waker::from(task_wakes.clone());
        let mut cx = Context::from_waker(&task_waker);

        assert!(inline.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), REPOLLS);
        assert_eq!(
            task_wakes.0.load(Ordering::SeqCst),
            1,
            "it yields to the task"
        );
        assert!(inline.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 2 * REPOLLS);
        assert_eq!(task_wakes.0.load(Ordering::SeqCst), 2);
    }

    /// On the runtime: a task whose future wakes itself mid-poll and another whose future is
    /// woken from elsewhere both finish.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tasks_finish_on_the_runtime() {
        let (f, polls, _) = selfish(3, 4);
        tokio::spawn(Inline::new(f)).await.unwrap();
        assert_eq!(polls.load(Ordering::SeqCst), 4);

        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let waiting = tokio::spawn(Inline::new(rx));
        tokio::task::yield_now().await;
        tx.send(7).unwrap();
        assert_eq!(waiting.await.unwrap().unwrap(), 7);
    }

    #[derive(Default)]
    struct Counter(AtomicUsize);

    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}
