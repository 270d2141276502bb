//! Sector-aligned buffers for O_DIRECT IO, and a small pool of them.
//!
//! O_DIRECT wants the buffer address, the length and the file offset aligned to the
//! logical sector; 4 KiB covers every device we meet. Allocations of 128 KiB and up go to
//! mmap in glibc, and a fresh mapping costs a page fault per 4 KiB on first touch, so the
//! hot paths borrow buffers from a pool instead of allocating per request.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Mutex;

/// Alignment of every IO buffer and of every drive offset.
pub const SECTOR_BYTES: usize = 4096;

/// A zero-initialised heap buffer whose address is `SECTOR_BYTES` aligned.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only allow reads of initialised bytes.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (capacity rounded up to whole sectors).
    pub fn zeroed(len: usize) -> AlignedBuf {
        let cap = len.div_ceil(SECTOR_BYTES).max(1) * SECTOR_BYTES;
        let layout = Layout::from_size_align(cap, SECTOR_BYTES).expect("buffer layout");
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len, cap }
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Change the visible length within the capacity (contents beyond are kept).
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.cap, "AlignedBuf::set_len beyond capacity");
        self.len = len;
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap >= len initialised (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.cap, SECTOR_BYTES).expect("buffer layout");
        // SAFETY: allocated in `zeroed` with this very layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

/// True when `buf` can be handed to an O_DIRECT read or write as it is.
pub fn is_aligned(buf: &[u8]) -> bool {
    (buf.as_ptr() as usize).is_multiple_of(SECTOR_BYTES) && buf.len().is_multiple_of(SECTOR_BYTES)
}

/// A bounded pool of aligned buffers: at most `keep_max` buffers and `keep_bytes_max`
/// bytes are kept; anything beyond is freed. `take` hands out the smallest buffer that
/// fits, so a small request does not pin a stripe-sized buffer.
pub struct BufPool {
    free: Mutex<(Vec<AlignedBuf>, usize)>,
    keep_max: usize,
    keep_bytes_max: usize,
}

impl BufPool {
    pub fn new(keep_max: usize, keep_bytes_max: usize) -> BufPool {
        BufPool { free: Mutex::new((Vec::new(), 0)), keep_max, keep_bytes_max }
    }

    /// A buffer of exactly `len` visible bytes; contents are unspecified.
    pub fn take(&self, len: usize) -> AlignedBuf {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let best = free.0.iter().enumerate().filter(|(_, b)| b.capacity() >= len).min_by_key(|(_, b)| b.capacity());
        if let Some((i, _)) = best {
            let mut b = free.0.swap_remove(i);
            free.1 -= b.capacity();
            b.set_len(len);
            return b;
        }
        drop(free);
        AlignedBuf::zeroed(len)
    }

    pub fn give(&self, buf: AlignedBuf) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.0.len() < self.keep_max && free.1 + buf.capacity() <= self.keep_bytes_max {
            free.1 += buf.capacity();
            free.0.push(buf);
        }
    }
}
