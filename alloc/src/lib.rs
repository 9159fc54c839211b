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

/// mimalloc's `purge_decommits` option: its place in mimalloc's `mi_option_t` (the same in
/// v2 and v3), which the bindings do not name.
const PURGE_DECOMMITS: mi::mi_option_t = 5;

/// Has mimalloc give the memory it purges back with `MADV_FREE` instead of `MADV_DONTNEED`,
/// unless the environment sets `MIMALLOC_PURGE_DECOMMITS` (which then wins). Call it first
/// thing in `main`.
///
/// mimalloc purges memory that has stayed free for a second. With `MADV_DONTNEED` the pages
/// are gone at once, and the next use of that memory faults each page in again and clears it.
/// A store that frees many records at once and fills the memory again over the next seconds
/// (records coming due after a burst of calls) paid that on most calls: 0.7 page faults a
/// call. With `MADV_FREE` the kernel takes the pages back only when it needs the memory, and
/// memory used again before that costs nothing. Until then the pages count in the process's
/// RSS, so after a burst the RSS stays near its peak while the machine has memory to spare.
pub fn purge_lazily() {
    // SAFETY: sets an option's default value; no memory is touched.
    unsafe { mi::mi_option_set_enabled_default(PURGE_DECOMMITS, false) }
}

/// Whether mimalloc purges with `MADV_DONTNEED` (`true`) or `MADV_FREE` (`false`).
pub fn purge_decommits() -> bool {
    // SAFETY: reads an option.
    unsafe { mi::mi_option_is_enabled(PURGE_DECOMMITS) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn purges_lazily_unless_the_environment_says_otherwise() {
        let from_env = std::env::var("MIMALLOC_PURGE_DECOMMITS").ok();
        assert!(from_env.is_some() || purge_decommits(), "mimalloc's own default");
        purge_lazily();
        match from_env.as_deref() {
            None => assert!(!purge_decommits()),
            Some(v) => assert_eq!(purge_decommits(), !matches!(v, "0" | "false" | "off" | "no")),
        }
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
