//! Any 4 KiB block: superblock decoding returns a superblock whose geometry is valid, or an
//! error; it never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nacre_raid::superblock::{SB_BYTES, Superblock};

fuzz_target!(|data: &[u8]| {
    let mut b = vec![0u8; SB_BYTES];
    let n = data.len().min(SB_BYTES);
    b[..n].copy_from_slice(&data[..n]);
    if let Ok(sb) = Superblock::decode(&b) {
        assert!(sb.geometry().is_ok());
    }
});
