//! The process allocator: mimalloc, called the way the system allocator is called.
//!
//! `mimalloc::MiMalloc` sends every allocation through `mi_malloc_aligned`. Its fast path takes
//! only a block that happens to be free and aligned in a small size class (at most 1 KiB);
//! anything else, a 2 KiB `String` of alignment 1 included, goes through the generic
//! over-allocating path, about 240 instructions each. Every mimalloc block is a whole number of
//! words from a word-aligned start, so an alignment of at most a word is met by plain
//! `mi_malloc`, which has a fast path for every size. Larger alignments (tokio's cache-padded
//! task cells) still go to `mi_malloc_aligned`.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// mimalloc with plain calls for alignments up to a word.
pub struct Mimalloc;

/// Alignments every mimalloc block has.
const WORD: usize = std::mem::size_of::<usize>();

// SAFETY: each method forwards to the mimalloc function of the same contract; a block from
// `mi_malloc` meets any alignment up to a word (every block is word-aligned), and `mi_free` and
// `mi_realloc_aligned` take blocks from any of them.
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        unsafe {
            if layout.align() <= WORD {
                mi::mi_malloc(layout.size()).cast()
            } else {
                mi::mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        unsafe {
            if layout.align() <= WORD {
                mi::mi_zalloc(layout.size()).cast()
            } else {
                mi::mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from one of the allocations above.
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from one of the allocations above, with `layout`.
        unsafe {
            if layout.align() <= WORD {
                mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

unsafe extern "C" {
    /// mimalloc's collection of the calling thread's heap and of the shared arenas.
    fn mi_collect(force: bool);
}

/// Gives back to the OS, on the calling thread, every range of memory the allocator holds free,
/// without waiting for its purge delay. mimalloc's arenas are shared by all threads, and a
/// range freed by one thread is purged (`madvise(MADV_DONTNEED)`) by whichever thread gets to
/// it first once the delay (1 s) has passed; calling this often enough from a thread of one's
/// own keeps that work off the others.
pub fn purge() {
    // SAFETY: `mi_collect` takes no pointer and may be called from any thread at any time;
    // with `force` it collects the calling thread's own heap and purges the arenas' free
    // ranges, which every thread may do.
    unsafe { mi_collect(true) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The resident set of this process, in KiB.
    #[cfg(target_os = "linux")]
    fn rss_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn purge_gives_freed_memory_back_without_waiting_for_the_delay() {
        const BLOCK: usize = 1 << 20;
        const BLOCKS: usize = 128;
        let a = Mimalloc;
        let layout = Layout::from_size_align(BLOCK, WORD).unwrap();
        let blocks: Vec<*mut u8> = (0..BLOCKS)
            .map(|_| unsafe {
                let p = a.alloc(layout);
                assert!(!p.is_null());
                std::ptr::write_bytes(p, 1, BLOCK);
                p
            })
            .collect();
        for p in blocks {
            unsafe { a.dealloc(p, layout) };
        }
        // Freed but not yet purged: the allocator keeps it for its purge delay (1 s).
        let freed = rss_kib();
        purge();
        let purged = rss_kib();
        assert!(
            purged + 64 * 1024 < freed,
            "RSS {freed} KiB after freeing 128 MiB, {purged} KiB after the purge"
        );
    }

    #[test]
    fn every_block_meets_its_alignment_and_keeps_its_bytes() {
        let a = Mimalloc;
        let mut blocks = Vec::new();
        for size in (1..=4200).step_by(7).chain([8192, 65_536, 1 << 20]) {
            for align in [1, 2, 4, 8, 16, 64, 128, 4096] {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: a non-zero size; the block is freed below with its layout.
                let (p, z) = unsafe { (a.alloc(layout), a.alloc_zeroed(layout)) };
                assert!(!p.is_null() && !z.is_null());
                assert_eq!(p as usize % align, 0, "alloc {size} align {align}");
                assert_eq!(z as usize % align, 0, "alloc_zeroed {size} align {align}");
                // SAFETY: both blocks are `size` bytes.
                unsafe {
                    assert!(std::slice::from_raw_parts(z, size).iter().all(|&b| b == 0));
                    std::ptr::write_bytes(p, (size % 251) as u8, size);
                }
                blocks.push((p, layout));
                // SAFETY: allocated above with `layout`.
                unsafe { a.dealloc(z, layout) };
            }
        }
        for (p, layout) in blocks {
            let grown = layout.size() * 2 + 3;
            // SAFETY: `p` holds `layout.size()` bytes written above; the grown block is freed
            // with its own layout.
            unsafe {
                let q = a.realloc(p, layout, grown);
                assert_eq!(q as usize % layout.align(), 0, "realloc {layout:?}");
                let kept = std::slice::from_raw_parts(q, layout.size());
                assert!(kept.iter().all(|&b| b == (layout.size() % 251) as u8));
                a.dealloc(q, Layout::from_size_align(grown, layout.align()).unwrap());
            }
        }
    }
}
