//! Parallel-runner tests: every task runs exactly once, and chunking is aligned and complete.

use std::sync::atomic::{AtomicUsize, Ordering};

use kwker_kernels::par::{chunk_ranges, Parallel, ScopedThreads, Serial};

fn count_runs(par: &dyn Parallel, n: usize) -> Vec<usize> {
    let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
    par.run(n, &|i| {
        hits[i].fetch_add(1, Ordering::Relaxed);
    });
    hits.into_iter().map(AtomicUsize::into_inner).collect()
}

#[test]
fn each_task_runs_once() {
    for n in [0, 1, 2, 3, 17, 100] {
        assert!(count_runs(&Serial, n).iter().all(|&c| c == 1));
        for threads in [0, 1, 2, 5] {
            assert!(count_runs(&ScopedThreads(threads), n)
                .iter()
                .all(|&c| c == 1));
        }
    }
}

#[test]
#[should_panic(expected = "task 3 failed")]
fn task_panics_propagate() {
    ScopedThreads(2).run(8, &|i| assert!(i != 3, "task {i} failed"));
}

#[test]
fn chunk_ranges_cover_aligned_and_balanced() {
    for n in [0, 1, 5, 16, 17, 100, 1536, 49152] {
        for parts in [1, 2, 3, 7, 64] {
            for align in [1, 8, 16, 32] {
                let r = chunk_ranges(n, parts, align);
                assert!(r.len() <= parts);
                let mut next = 0;
                for c in &r {
                    assert_eq!(c.start, next, "n={n} parts={parts} align={align}: {r:?}");
                    assert!(c.end > c.start);
                    assert!(c.start % align == 0 && (c.end % align == 0 || c.end == n));
                    next = c.end;
                }
                assert_eq!(next, n);
                // Balanced to within one alignment unit (except the ragged last unit).
                if let (Some(min), Some(max)) = (
                    r.iter().map(|c| c.len()).min(),
                    r.iter().map(|c| c.len()).max(),
                ) {
                    assert!(
                        max - min <= 2 * align,
                        "n={n} parts={parts} align={align}: {r:?}"
                    );
                }
            }
        }
    }
}
