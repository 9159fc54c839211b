//! A future that is polled only when it was woken itself.
//!
//! A connection's or a call's task waits on its work and, beside it, on a rare event (the
//! listener stopping, the run being cancelled) in one `select!`. The task is woken several times
//! per request by its sockets, and `select!` polls every branch at every wake; polling a
//! watch or `Notify` future is a lock each time. [`Gated`] gives the inner future a waker of its
//! own and polls it only after that waker fired (and on the first poll, which registers it), so
//! the task's other wakes cost one atomic swap.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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

    #[derive(Default)]
    struct Counter(AtomicUsize);

    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}
