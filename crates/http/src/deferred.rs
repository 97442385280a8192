//! Deferred answers: a response decided later, by another thread, while the connection waits in
//! the event loop holding no worker.
//!
//! A handler that has long work to do (a walk of a big tree) returns
//! [`Response::deferred`](crate::Response::deferred) with the [`Deferred`] end of a
//! [`channel`], and gives the [`Answer`] end to a thread of its own (an executor) that does the
//! work and [`send`](Answer::send)s the whole response, any status. Meanwhile the connection is
//! parked watching only for the peer leaving; the answer's arrival wakes it. So long calls
//! cannot take every worker: the workers go on answering `/health` and the rest.
//!
//! An [`Answer`] dropped without `send` closes the connection without an answer (the work
//! failed in a way it could not report: a panic); [`Answer::is_abandoned`] tells the worker
//! that the client left, so it may stop early.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::response::Response;
use crate::stream::Waker;

/// Makes a deferred answer: the worker's end and the connection's end.
pub fn channel() -> (Answer, Deferred) {
    let shared = Arc::new(Mutex::new(State {
        answer: None,
        answer_gone: false,
        deferred_gone: false,
        waiter: None,
    }));
    (
        Answer {
            shared: Arc::clone(&shared),
        },
        Deferred { shared },
    )
}

struct State {
    answer: Option<Response>,
    /// The answer end was dropped (after sending or not).
    answer_gone: bool,
    /// The connection closed (the client left) or never took the answer.
    deferred_gone: bool,
    waiter: Option<Waker>,
}

/// The end that sends the response, once.
pub struct Answer {
    shared: Arc<Mutex<State>>,
}

/// The end a response carries; the connection waits on it.
pub struct Deferred {
    shared: Arc<Mutex<State>>,
}

/// What the connection finds when it looks.
pub(crate) enum Ready {
    Answer(Response),
    Pending,
    /// The answer end was dropped without a response.
    Abandoned,
}

impl Answer {
    /// Sends the response; the connection writes it as if the handler had returned it.
    pub fn send(self, response: Response) {
        let waiter = {
            let mut state = lock(&self.shared);
            state.answer = Some(response);
            state.waiter.take()
        };
        if let Some(wake) = waiter {
            wake();
        }
    }

    /// True when nobody will read the answer (the client left): the work may stop.
    pub fn is_abandoned(&self) -> bool {
        lock(&self.shared).deferred_gone
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        let waiter = {
            let mut state = lock(&self.shared);
            state.answer_gone = true;
            state.waiter.take()
        };
        if let Some(wake) = waiter {
            wake();
        }
    }
}

impl Deferred {
    /// The answer if it came; else `waker` is kept to be called when it comes.
    pub(crate) fn poll(&self, waker: &dyn Fn() -> Waker) -> Ready {
        let mut state = lock(&self.shared);
        if let Some(response) = state.answer.take() {
            return Ready::Answer(response);
        }
        if state.answer_gone {
            return Ready::Abandoned;
        }
        state.waiter = Some(waker());
        Ready::Pending
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        let mut state = lock(&self.shared);
        state.deferred_gone = true;
        state.waiter = None;
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn the_answer_wakes_the_waiting_connection_once() {
        let (answer, deferred) = channel();
        let woken = Arc::new(AtomicUsize::new(0));
        let make = || -> Waker {
            let woken = Arc::clone(&woken);
            Box::new(move || {
                woken.fetch_add(1, Ordering::SeqCst);
            })
        };
        assert!(matches!(deferred.poll(&make), Ready::Pending));
        assert_eq!(woken.load(Ordering::SeqCst), 0);
        answer.send(Response::empty(204));
        assert_eq!(woken.load(Ordering::SeqCst), 1);
        match deferred.poll(&make) {
            Ready::Answer(response) => assert_eq!(response.status, 204),
            _ => panic!("the answer was sent"),
        }
    }

    #[test]
    fn a_dropped_answer_is_abandoned_and_a_gone_client_is_seen() {
        let (answer, deferred) = channel();
        let make = || -> Waker { Box::new(|| {}) };
        assert!(!answer.is_abandoned());
        drop(answer);
        assert!(matches!(deferred.poll(&make), Ready::Abandoned));

        let (answer, deferred) = channel();
        drop(deferred);
        assert!(answer.is_abandoned());
        answer.send(Response::empty(200));
    }
}
