//! Per-thread reusable f32 scratch memory (packed weight panels, attention scores, split activations).
//!
//! Why: kernels run thousands of times per second on pool threads; allocating ~1 MB per call
//! would hit mmap/munmap and page faults every time. Contract: the slice handed out is
//! 64-byte aligned and holds stale data from earlier calls; callers must initialise what they
//! read.

use std::cell::RefCell;

thread_local! {
    /// Free buffers, the last released on top: a nested call (a task run on the thread whose call
    /// holds a buffer) takes the next one down, so each nesting level keeps reusing its own.
    static SCRATCH: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// Buffers larger than this are released after use instead of being kept by the thread.
const KEEP_MAX_FLOATS: usize = 16 << 20;
/// Buffers a thread keeps (the deepest nesting the kernels use, with room).
const KEEP_BUFFERS: usize = 4;
/// 64-byte alignment, in f32s.
const ALIGN_FLOATS: usize = 16;

/// Calls `f` with a 64-byte-aligned scratch slice of exactly `len` floats.
/// Re-entrant: a nested call gets another buffer.
pub(crate) fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let mut buf = SCRATCH.with(|s| s.borrow_mut().pop()).unwrap_or_default();
    let need = len + ALIGN_FLOATS;
    if buf.len() < need {
        buf = vec![0.0; need];
    }
    let off = buf.as_ptr().align_offset(64).min(ALIGN_FLOATS);
    let result = f(&mut buf[off..off + len]);
    if buf.len() <= KEEP_MAX_FLOATS {
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            if s.len() < KEEP_BUFFERS {
                s.push(buf);
            }
        });
    }
    result
}
