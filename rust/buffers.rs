//! A bounded cache of large output buffers, so that a call that allocates its outputs
//! does not page-fault fresh memory in on every call.
//!
//! Why: glibc returns large blocks to the operating system when they are freed (an
//! `mmap`ed block is unmapped; two large blocks freed together at the top of the heap
//! are trimmed), and the next call that asks for the same size gets fresh pages, each
//! faulted in and zeroed by the kernel on first write. On W1 (two 8 MiB outputs) that is
//! about a thousand page faults a call, in a process that imports torch, and made the
//! allocating `gae` 2–4× the time of the same call given `out=`.
//!
//! Here a block of [`MIN_BYTES`] or more is leased from the cache and, when the lease is
//! dropped (the output array that owns it is freed), kept for the next call instead of
//! freed, as long as the cache holds at most its cap. Blocks come in size classes
//! (eight per power of two, so a block is at most 12.5% larger than asked for), so that
//! batches whose size varies a little (packed layouts) still reuse each other's blocks.
//! The most recently returned block of a class is leased first (it is the likeliest to
//! be in the CPU caches), and the oldest blocks are freed first when the cap is reached.
//!
//! The cap, in bytes, comes from the environment variable [`ENV_VAR`] when the cache is
//! first used (default [`DEFAULT_CAP`]); 0 disables the cache ([`lease`] then returns
//! None, and outputs are allocated by NumPy as usual).

use std::alloc::{alloc, dealloc, Layout};
use std::ptr::NonNull;
use std::sync::Mutex;

pub const ENV_VAR: &str = "COMPPO_BUFFER_CACHE_BYTES";

/// The cap when [`ENV_VAR`] is unset or not a number.
pub const DEFAULT_CAP: usize = 256 << 20;

/// Outputs smaller than this are left to NumPy's allocator, which serves them from
/// memory it keeps (glibc's heap) anyway.
pub const MIN_BYTES: usize = 256 << 10;

/// From this size on a block is aligned to 2 MiB and asks for transparent huge pages,
/// as NumPy's own allocator does from 4 MiB on: a fresh block then costs one page fault
/// per 2 MiB instead of one per 4 KiB.
const HUGE_BYTES: usize = 4 << 20;

/// A block of memory: `capacity` bytes at `ptr`, uninitialised until written.
pub struct Block {
    ptr: NonNull<u8>,
    capacity: usize,
}

// SAFETY: a block is plain memory owned by whoever holds the `Block`.
unsafe impl Send for Block {}
// SAFETY: `&Block` only hands out the address; writes go through it under the caller's
// own synchronisation (an output array).
unsafe impl Sync for Block {}

impl Block {
    /// The layout of a block of `capacity` bytes, or None when no allocation can be
    /// that large.
    fn layout(capacity: usize) -> Option<Layout> {
        let align = if capacity >= HUGE_BYTES { 2 << 20 } else { 4096 };
        Layout::from_size_align(capacity, align).ok()
    }

    /// A fresh block of `capacity` (> 0) bytes, or None when the memory cannot be had.
    fn new(capacity: usize) -> Option<Block> {
        let layout = Block::layout(capacity)?;
        // SAFETY: the layout has a nonzero size.
        let ptr = NonNull::new(unsafe { alloc(layout) })?;
        if capacity >= HUGE_BYTES {
            advise_huge_pages(ptr, capacity);
        }
        Some(Block { ptr, capacity })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        let layout = Block::layout(self.capacity).expect("the layout the block was allocated with");
        // SAFETY: allocated in `Block::new` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

#[cfg(target_os = "linux")]
fn advise_huge_pages(ptr: NonNull<u8>, len: usize) {
    extern "C" {
        fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: std::ffi::c_int) -> std::ffi::c_int;
    }
    const MADV_HUGEPAGE: std::ffi::c_int = 14;
    // SAFETY: a hint on memory this process owns (the block, 2 MiB-aligned); a failure
    // (no transparent huge pages) changes nothing.
    unsafe { madvise(ptr.as_ptr().cast(), len, MADV_HUGEPAGE) };
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_ptr: NonNull<u8>, _len: usize) {}

/// The capacity of the block that serves a request of `bytes` (> 0): `bytes` rounded up
/// to a multiple of an eighth of the power of two below it (None past `usize::MAX`).
pub fn size_class(bytes: usize) -> Option<usize> {
    let step = (1usize << bytes.max(8).ilog2()) / 8;
    bytes.div_ceil(step).checked_mul(step)
}

/// Blocks kept for reuse, oldest first, holding at most `cap` bytes.
pub struct Cache {
    cap: usize,
    held: usize,
    blocks: Vec<Block>,
}

impl Cache {
    pub const fn new(cap: usize) -> Cache {
        Cache { cap, held: 0, blocks: Vec::new() }
    }

    /// A block of at least `bytes` (> 0) bytes: the most recently returned one of its
    /// size class, else a fresh one (None when the memory cannot be had).
    pub fn take(&mut self, bytes: usize) -> Option<Block> {
        let class = size_class(bytes)?;
        match self.blocks.iter().rposition(|b| b.capacity == class) {
            Some(k) => {
                let block = self.blocks.remove(k);
                self.held -= block.capacity;
                Some(block)
            }
            None => Block::new(class),
        }
    }

    /// Keeps `block` for reuse, freeing the oldest blocks while more than the cap is
    /// held (`block` itself when it alone is larger).
    pub fn give(&mut self, block: Block) {
        if block.capacity > self.cap {
            return;
        }
        self.held += block.capacity;
        self.blocks.push(block);
        let mut excess = self.held.saturating_sub(self.cap);
        let mut freed = 0;
        while excess > 0 {
            excess = excess.saturating_sub(self.blocks[freed].capacity);
            self.held -= self.blocks[freed].capacity;
            freed += 1;
        }
        self.blocks.drain(..freed);
    }

    /// Bytes held for reuse.
    pub fn held(&self) -> usize {
        self.held
    }

    pub fn cap(&self) -> usize {
        self.cap
    }
}

static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

fn cache<R>(f: impl FnOnce(&mut Cache) -> R) -> R {
    // A poisoned lock only means a thread panicked while holding it; the cache is a list
    // of whole blocks and a count updated after each change, still consistent.
    let mut guard = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    f(guard.get_or_insert_with(|| Cache::new(cap_from_env())))
}

fn cap_from_env() -> usize {
    std::env::var(ENV_VAR).ok().and_then(|s| s.trim().parse::<usize>().ok()).unwrap_or(DEFAULT_CAP)
}

/// A block leased from the cache; dropping the lease gives the block back.
pub struct Lease(Option<Block>);

impl Lease {
    pub fn as_ptr(&self) -> *mut u8 {
        self.0.as_ref().expect("a lease holds its block until dropped").as_ptr()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(block) = self.0.take() {
            cache(|c| c.give(block));
        }
    }
}

/// A block of at least `bytes` bytes from the cache, or None when `bytes` is under
/// [`MIN_BYTES`], the cache is disabled (cap 0) or the memory cannot be had (the caller
/// then asks NumPy, which raises `MemoryError`).
pub fn lease(bytes: usize) -> Option<Lease> {
    if bytes < MIN_BYTES {
        return None;
    }
    cache(|c| if c.cap() > 0 { c.take(bytes).map(|b| Lease(Some(b))) } else { None })
}

/// `(bytes held for reuse, cap)` of the process's cache.
pub fn stats() -> (usize, usize) {
    cache(|c| (c.held(), c.cap()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_round_up_by_at_most_an_eighth() {
        assert_eq!(size_class(8 << 20), Some(8 << 20));
        assert_eq!(size_class((8 << 20) + 1), Some(9 << 20));
        assert_eq!(size_class(1), Some(1));
        for bytes in [1000usize, 4097, 300_000, 8_388_607, 123_456_789] {
            let c = size_class(bytes).unwrap();
            assert!(c >= bytes && c - bytes <= bytes / 8, "{bytes} -> {c}");
            assert_eq!(size_class(c), Some(c));
        }
        assert_eq!(size_class(usize::MAX), None);
    }

    #[test]
    fn a_returned_block_is_reused_most_recent_first() {
        let mut cache = Cache::new(64 << 20);
        let (a, b) = (cache.take(4 << 20).unwrap(), cache.take(4 << 20).unwrap());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        assert_ne!(pa, pb);
        cache.give(a);
        cache.give(b);
        assert_eq!(cache.held(), 8 << 20);
        // A request of the same class, a little smaller, gets the last block returned.
        assert_eq!(cache.take((4 << 20) - 1000).unwrap().as_ptr(), pb);
        assert_eq!(cache.take(4 << 20).unwrap().as_ptr(), pa);
        assert_eq!(cache.held(), 0);
        // Another class is never served from these.
        cache.give(Block::new(4 << 20).unwrap());
        assert_eq!(cache.take(8 << 20).unwrap().capacity(), 8 << 20);
        assert_eq!(cache.held(), 4 << 20);
    }

    #[test]
    fn the_cap_frees_the_oldest_blocks_and_zero_keeps_none() {
        let mut cache = Cache::new(10 << 20);
        let blocks: Vec<Block> = (0..3).map(|_| Block::new(4 << 20).unwrap()).collect();
        let first_two: Vec<*mut u8> = blocks.iter().skip(1).map(Block::as_ptr).collect();
        for b in blocks {
            cache.give(b);
        }
        assert_eq!(cache.held(), 8 << 20);
        let left: Vec<*mut u8> = cache.blocks.iter().map(Block::as_ptr).collect();
        assert_eq!(left, first_two);
        cache.give(Block::new(16 << 20).unwrap()); // larger than the cap alone: freed
        assert_eq!(cache.held(), 8 << 20);
        let mut none = Cache::new(0);
        none.give(Block::new(1 << 20).unwrap());
        assert_eq!(none.held(), 0);
    }

    #[test]
    fn blocks_are_aligned_and_writable() {
        for bytes in [MIN_BYTES, 5 << 20] {
            let b = Block::new(size_class(bytes).unwrap()).unwrap();
            assert_eq!(b.as_ptr() as usize % 4096, 0);
            // SAFETY: the block holds `capacity` bytes.
            unsafe { std::ptr::write_bytes(b.as_ptr(), 7, b.capacity()) };
        }
    }

    #[test]
    fn small_or_impossible_requests_are_not_leased() {
        assert!(lease(MIN_BYTES - 1).is_none());
        assert!(lease(usize::MAX / 2).is_none());
        assert!(Cache::new(usize::MAX).take(isize::MAX as usize).is_none());
    }
}
