//! A global allocator that counts the heap of the threads that ask for it: what `proxy-bench`
//! reports per idle connection and what `tests/memory.rs` bounds. Not part of the library;
//! both include this file (`#[path]`) and install `Counting` as their global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};

/// The system allocator, counting for tracked threads.
pub struct Counting;

thread_local! {
    static TRACKED: Cell<bool> = const { Cell::new(false) };
}
static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

/// Counts (or stops counting) the allocations of the calling thread.
pub fn track(on: bool) {
    TRACKED.with(|t| t.set(on));
}

/// Bytes allocated and not freed by tracked threads (a thread that frees what another
/// allocated counts it only if it is tracked too).
pub fn live_bytes() -> isize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// Allocations (and reallocations) made by tracked threads.
#[allow(dead_code)]
pub fn allocations() -> usize {
    ALLOCATIONS.load(Ordering::Relaxed)
}

fn tracked() -> bool {
    TRACKED.try_with(Cell::get).unwrap_or(false)
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if tracked() {
            LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if tracked() {
            LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        }
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if tracked() {
            LIVE_BYTES.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        System.realloc(ptr, layout, new_size)
    }
}
