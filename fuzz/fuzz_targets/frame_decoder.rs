//! Any byte stream, cut anywhere: the frame decoder returns frames or a named error, never
//! panics, and never holds more than it was fed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nacre_net::frame::{FrameDecoder, FrameLimits};

fuzz_target!(|data: &[u8]| {
    let Some((&cut, stream)) = data.split_first() else { return };
    let mut dec = FrameDecoder::new(FrameLimits { body_max: 4096, bulk_max: 1 << 16 });
    let step = cut as usize + 1;
    let mut fed = 0;
    for chunk in stream.chunks(step) {
        dec.feed(chunk);
        fed += chunk.len();
        loop {
            match dec.next_frame() {
                Ok(Some(f)) => {
                    assert_eq!(f.body.len(), f.header.body_len as usize);
                    assert_eq!(f.bulk.len(), f.header.bulk_len as usize);
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
        assert!(dec.buffered() <= fed);
    }
    let _ = dec.finish();
});
