//! A thread's spare allocations for the per-request vectors: a head's bytes and field ranges,
//! and a response's headers. A keep-alive request on a worker takes them back from the previous
//! one instead of calling the allocator (musl's takes a lock on every call): a `/health` made
//! three `malloc`/`free` pairs per request before. One of each is kept per thread, and only
//! if small, so a large head does not pin its memory.

use std::borrow::Cow;
use std::cell::Cell;
use std::ops::Range;

/// A response's header list.
pub(crate) type Headers = Vec<(&'static str, Cow<'static, str>)>;
/// A head's field ranges (name, value).
pub(crate) type Fields = Vec<(Range<usize>, Range<usize>)>;

/// Largest head buffer kept (most heads are a few hundred bytes).
const KEPT_BYTES: usize = 4096;
/// Most entries of a kept vector of fields or headers.
const KEPT_ENTRIES: usize = 32;

thread_local! {
    static HEAD_BYTES: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
    static FIELDS: Cell<Fields> = const { Cell::new(Vec::new()) };
    static HEADERS: Cell<Headers> = const { Cell::new(Vec::new()) };
}

/// An empty vector, with the thread's spare capacity if it has one.
fn take<T>(key: &'static std::thread::LocalKey<Cell<Vec<T>>>) -> Vec<T> {
    key.try_with(Cell::take).unwrap_or_default()
}

/// Keeps `vec`'s allocation as the thread's spare when it is small.
fn give<T>(key: &'static std::thread::LocalKey<Cell<Vec<T>>>, mut vec: Vec<T>, most: usize) {
    if vec.capacity() == 0 || vec.capacity() > most {
        return;
    }
    vec.clear();
    // Fails only while the thread exits: the vector is then simply freed.
    let _ = key.try_with(|spare| spare.set(vec));
}

pub(crate) fn head_bytes() -> Vec<u8> {
    take(&HEAD_BYTES)
}

pub(crate) fn give_head_bytes(bytes: Vec<u8>) {
    give(&HEAD_BYTES, bytes, KEPT_BYTES);
}

pub(crate) fn fields() -> Fields {
    take(&FIELDS)
}

pub(crate) fn give_fields(fields: Fields) {
    give(&FIELDS, fields, KEPT_ENTRIES);
}

pub(crate) fn headers() -> Headers {
    take(&HEADERS)
}

pub(crate) fn give_headers(headers: Headers) {
    give(&HEADERS, headers, KEPT_ENTRIES);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_vector_is_reused_and_a_large_one_freed() {
        let mut bytes = head_bytes();
        bytes.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        let pointer = bytes.as_ptr();
        give_head_bytes(bytes);
        let again = head_bytes();
        assert!(again.is_empty());
        assert_eq!(again.as_ptr(), pointer, "the same allocation");
        assert_eq!(head_bytes().capacity(), 0, "one spare, taken");

        give_head_bytes(vec![0; KEPT_BYTES + 1]);
        assert_eq!(head_bytes().capacity(), 0, "too large to keep");
    }
}
