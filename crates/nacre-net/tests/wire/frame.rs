//! Frames: round trips through a stream cut at random places, and every kind of malformed
//! input refused with the error that names it. Randomized tests print their seed.

use nacre_net::frame::*;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn seed(test: &str) -> u64 {
    let seed = std::env::var("NACRE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("{test}: seed {seed} (rerun with NACRE_SEED={seed})");
    seed
}

fn header(rng: &mut Rng, body: u32, bulk: u32) -> FrameHeader {
    FrameHeader {
        opcode: rng.next() as u16,
        flags: rng.next() as u16 & flags::KNOWN,
        status: rng.next() as i32,
        xid: rng.next(),
        body_len: body,
        bulk_len: bulk,
        job_id: rng.next(),
        timeout_ms: rng.next() as u32,
        acked_xid: rng.next(),
        service_us: rng.next() as u32,
        transno: rng.next(),
        last_committed: rng.next(),
    }
}

#[test]
fn frames_survive_any_cut_of_the_stream() {
    let mut rng = Rng(seed("frames_survive_any_cut"));
    let limits = FrameLimits::default();
    let mut sent = Vec::new();
    let mut stream = Vec::new();
    for _ in 0..200 {
        let body = rng.below(2000) as usize;
        let bulk = if rng.below(4) == 0 { rng.below(300_000) as usize } else { 0 };
        let h = header(&mut rng, body as u32, bulk as u32);
        let (b, k) = (rng.bytes(body), rng.bytes(bulk));
        stream.extend_from_slice(&encode_frame(&h, &b, &k));
        sent.push(Frame { header: h, body: b, bulk: k.into() });
    }
    let mut dec = FrameDecoder::new(limits);
    let mut got = Vec::new();
    let mut at = 0;
    while at < stream.len() {
        let n = (1 + rng.below(70_000) as usize).min(stream.len() - at);
        dec.feed(&stream[at..at + n]);
        at += n;
        while let Some(f) = dec.next_frame().unwrap() {
            got.push(f);
        }
    }
    dec.finish().unwrap();
    assert_eq!(got.len(), sent.len());
    assert!(got == sent, "frames differ after the round trip");
}

fn refused(bytes: &[u8]) -> FrameError {
    let mut dec = FrameDecoder::new(FrameLimits::default());
    dec.feed(bytes);
    let e = dec.next_frame().expect_err("malformed input must be refused");
    // Sticky, and nothing kept for a stream that is broken.
    assert_eq!(dec.next_frame().unwrap_err(), e);
    assert_eq!(dec.buffered(), 0);
    e
}

fn valid() -> [u8; HEADER_BYTES] {
    let mut rng = Rng(7);
    header(&mut rng, 10, 0).encode()
}

/// Change bytes of a header and fix its checksum, as a peer that means it would.
fn resealed(mut b: [u8; HEADER_BYTES], at: usize, bytes: &[u8]) -> [u8; HEADER_BYTES] {
    b[at..at + bytes.len()].copy_from_slice(bytes);
    let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, &b[..HEADER_BYTES - 4]) as u32;
    b[HEADER_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
    b
}

#[test]
fn every_kind_of_malformed_header_is_named() {
    let good = valid();
    assert!(matches!(refused(&resealed(good, 0, b"HTTP")), FrameError::BadMagic(_)));
    assert_eq!(refused(&resealed(good, 4, &1u16.to_le_bytes())), FrameError::BadVersion(1));
    assert_eq!(refused(&resealed(good, 6, &48u16.to_le_bytes())), FrameError::BadHeaderLen(48));
    let mut flipped = good;
    flipped[20] ^= 1;
    assert!(matches!(refused(&flipped), FrameError::BadChecksum { .. }));
    assert_eq!(refused(&resealed(good, 10, &0x8000u16.to_le_bytes())), FrameError::UnknownFlags(0x8000));
    // Claimed lengths far over the limits are refused from the header alone: nothing of
    // that size is ever allocated.
    let e = refused(&resealed(good, 24, &u32::MAX.to_le_bytes()));
    assert_eq!(e, FrameError::BodyTooLong { len: u32::MAX, max: FrameLimits::default().body_max });
    let e = refused(&resealed(good, 28, &(BULK_BYTES_LIMIT + 1).to_le_bytes()));
    assert_eq!(e, FrameError::BulkTooLong { len: BULK_BYTES_LIMIT + 1, max: BULK_BYTES_LIMIT });
    // A receiver's own limit is below the format's.
    let mut dec = FrameDecoder::new(FrameLimits { body_max: 4, bulk_max: 1 << 20 });
    dec.feed(&good);
    assert_eq!(dec.next_frame().unwrap_err(), FrameError::BodyTooLong { len: 10, max: 4 });
    // Messages say what is wrong.
    assert!(FrameError::BadVersion(1).to_string().contains("frame version 1"));
}

#[test]
fn a_stream_that_stops_inside_a_frame_is_truncated() {
    let good = valid();
    let mut dec = FrameDecoder::new(FrameLimits::default());
    dec.feed(&good[..20]);
    assert_eq!(dec.next_frame().unwrap(), None);
    assert_eq!(dec.finish().unwrap_err(), FrameError::Truncated { have: 20, need: HEADER_BYTES });
    dec.feed(&good[20..]);
    dec.feed(&[1, 2, 3]);
    assert_eq!(dec.next_frame().unwrap(), None);
    assert_eq!(dec.finish().unwrap_err(), FrameError::Truncated { have: HEADER_BYTES + 3, need: HEADER_BYTES + 10 });
}

#[test]
fn garbage_never_panics_and_is_refused_at_the_first_header() {
    let mut rng = Rng(seed("garbage"));
    for _ in 0..5_000 {
        let n = rng.below(200) as usize;
        let junk = rng.bytes(n);
        let mut dec = FrameDecoder::new(FrameLimits::default());
        dec.feed(&junk);
        match dec.next_frame() {
            Ok(None) => assert!(n < HEADER_BYTES, "a full header's worth of garbage must be judged"),
            Ok(Some(_)) => panic!("random bytes decoded as a frame (magic and CRC both matched?)"),
            Err(_) => assert_eq!(dec.buffered(), 0),
        }
    }
    // Mutations of a valid header with the checksum resealed: decode or a named error.
    let good = valid();
    for _ in 0..20_000 {
        let at = rng.below(HEADER_BYTES as u64 - 4) as usize;
        let b = resealed(good, at, &[rng.next() as u8]);
        if let Ok(h) = FrameHeader::decode(&b, &FrameLimits::default()) {
            assert!(h.body_len <= FrameLimits::default().body_max && h.bulk_len <= BULK_BYTES_LIMIT);
            assert_eq!(h.flags & !flags::KNOWN, 0);
        }
    }
}
