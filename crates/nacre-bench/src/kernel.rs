//! `nacre raid bench --kernel`: single-thread throughput of the parity and reconstruction
//! kernels, ours against Intel ISA-L 2.32 in the same run (when built with
//! `--features isal`).
//!
//! For k+2 with k = 8 and 16: encode (k data strips → P, Q) and decode (two lost data
//! strips rebuilt from the k survivors; ISA-L gets the same decode coefficients, as an
//! ISA-L application would pass them to `ec_init_tables` + `ec_encode_data`), in three
//! regimes: `l1` (one stripe of 4 KiB strips, reused), `cache` (one stripe of 32 KiB
//! strips, reused: the working set sits in L2) and `stream` (128 KiB strips, 256 MiB of
//! data per pass, far beyond L3). GB/s (10^9 bytes/s) of data consumed, one thread.
//!
//! Sampling: each row is calibrated to ≈ 40 ms per sample, then all rows are swept once
//! per repetition with the implementations interleaved, so a burst of interference from
//! other tenants spoils a few samples of every row instead of every sample of a few rows.
//! The best sample is reported (the median too); ratios use the best.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use nacre_raid::ec::{Codec, Decoder, Kernel};
use serde_json::{Value, json};

use crate::raid::BenchError;

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;
const SAMPLE: Duration = Duration::from_millis(40);
/// Repetitions of the whole sweep.
const REPS: usize = 7;

/// Strips back to back in one 2 MiB-aligned arena, as a page-aligned buffer pool hands
/// them out (the worst case for cache-set aliasing). Ours and ISA-L run on the same bytes.
struct Strips {
    arena: Vec<u8>,
    base: usize,
    len: usize,
}

impl Strips {
    fn new(count: usize, len: usize, seed: &mut u64) -> Strips {
        let mut arena = vec![0u8; count * len + 2 * MIB];
        let base = arena.as_ptr().align_offset(2 * MIB);
        for chunk in arena[base..base + count * len].chunks_mut(8) {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            let b = seed.to_le_bytes();
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
        Strips { arena, base, len }
    }

    fn get(&self, i: usize) -> &[u8] {
        &self.arena[self.base + i * self.len..][..self.len]
    }

    fn refs(&self, range: std::ops::Range<usize>) -> Vec<&[u8]> {
        range.map(|i| self.get(i)).collect()
    }

    fn refs_mut(&mut self, range: std::ops::Range<usize>) -> Vec<&mut [u8]> {
        let len = self.len;
        self.arena[self.base + range.start * len..self.base + range.end * len].chunks_exact_mut(len).collect()
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Impl {
    Ours(Kernel),
    #[cfg(feature = "isal")]
    Isal,
}

impl Impl {
    fn name(self) -> String {
        match self {
            Impl::Ours(k) => format!("nacre/{}", k.name()),
            #[cfg(feature = "isal")]
            Impl::Isal => "isa-l-2.32".to_string(),
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Encode,
    Decode,
}

struct Workload {
    k: usize,
    op: Op,
    codec: Codec,
    decoder: Decoder,
    #[cfg(feature = "isal")]
    isal: nacre_raid::ec::isal::IsalTables,
    /// Per stripe: k input strips (data, or the survivors for decode).
    inputs: Strips,
    /// Per stripe: 2 output strips.
    outputs: Strips,
    stripes: usize,
}

impl Workload {
    fn new(k: usize, op: Op, strip: usize, stripes: usize, seed: &mut u64) -> Result<Workload, BenchError> {
        let bad = |e: nacre_raid::ec::CodecError| BenchError::Bad(e.to_string());
        let codec = Codec::new(k, 2).map_err(bad)?;
        let present: Vec<usize> = (2..k + 2).collect();
        let decoder = codec.decoder(&present, &[0, 1]).map_err(bad)?;
        #[cfg(feature = "isal")]
        let isal = match op {
            Op::Encode => nacre_raid::ec::isal::IsalTables::new(codec.matrix(), 2, k),
            Op::Decode => nacre_raid::ec::isal::IsalTables::new(decoder.coefficients(), 2, k),
        };
        let mut inputs = Strips::new(k * stripes, strip, seed);
        let outputs = Strips::new(2 * stripes, strip, seed);
        if op == Op::Decode {
            // The survivors of a real encoded stripe: data 2..k, then P and Q.
            for s in 0..stripes {
                let full = Strips::new(k, strip, seed);
                let mut parity = Strips::new(2, strip, seed);
                codec.encode(&full.refs(0..k), &mut parity.refs_mut(0..2));
                for (j, d) in inputs.refs_mut(s * k..(s + 1) * k).iter_mut().enumerate() {
                    d.copy_from_slice(if j < k - 2 { full.get(j + 2) } else { parity.get(j - (k - 2)) });
                }
            }
        }
        Ok(Workload {
            k,
            op,
            codec,
            decoder,
            #[cfg(feature = "isal")]
            isal,
            inputs,
            outputs,
            stripes,
        })
    }

    fn run(&mut self, imp: Impl, s: usize) {
        let k = self.k;
        let ins = self.inputs.refs(s * k..(s + 1) * k);
        let mut outs = self.outputs.refs_mut(s * 2..s * 2 + 2);
        match (imp, self.op) {
            (Impl::Ours(kernel), Op::Encode) => self.codec.encode_with(kernel, &ins, &mut outs),
            (Impl::Ours(kernel), Op::Decode) => self.decoder.apply_with(kernel, &ins, &mut outs),
            #[cfg(feature = "isal")]
            (Impl::Isal, _) => nacre_raid::ec::isal::isal_encode(&self.isal, &ins, &mut outs),
        }
    }

    fn bytes_per_call(&self) -> usize {
        self.k * self.inputs.len
    }

    /// `calls` calls cycling over the stripes; GB/s.
    fn time(&mut self, imp: Impl, calls: usize) -> f64 {
        let start = Instant::now();
        for c in 0..calls {
            self.run(imp, c % self.stripes);
        }
        (calls * self.bytes_per_call()) as f64 / start.elapsed().as_secs_f64() / 1e9
    }

    /// Every implementation must produce the same bytes, and decode must give back the
    /// data that was lost.
    fn verify(&mut self, impls: &[Impl]) -> Result<(), BenchError> {
        let mut first: Option<Vec<u8>> = None;
        for &imp in impls {
            self.run(imp, 0);
            let got = [self.outputs.get(0), self.outputs.get(1)].concat();
            match &first {
                None => first = Some(got),
                Some(f) if *f != got => return Err(BenchError::Verify(format!("{} disagrees", imp.name()))),
                Some(_) => {}
            }
        }
        Ok(())
    }
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s.get(s.len() / 2).copied().unwrap_or(0.0)
}

/// Run the sweep; prints a table, returns the figures.
pub fn run_kernel_bench(out: &mut dyn std::io::Write) -> Result<Value, BenchError> {
    #[cfg(feature = "isal")]
    let reference = Some(Impl::Isal);
    #[cfg(not(feature = "isal"))]
    let reference: Option<Impl> = None;
    let impls: Vec<Impl> = Kernel::all_available().into_iter().map(Impl::Ours).chain(reference).collect();
    let detected = Kernel::detect();
    let _ = writeln!(
        out,
        "nacre raid bench --kernel: kernel in use {}, reference {}; best of {REPS} samples of ~{} ms",
        detected.name(),
        if reference.is_some() { "Intel ISA-L 2.32 (same run)" } else { "none (build with --features isal)" },
        SAMPLE.as_millis()
    );
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    struct Row {
        mode: &'static str,
        w: Workload,
        calls: Vec<usize>,
        samples: Vec<Vec<f64>>,
    }
    let mut rows = Vec::new();
    for mode in ["l1", "cache", "stream"] {
        for k in [8usize, 16] {
            for op in [Op::Encode, Op::Decode] {
                let (strip, stripes) = match mode {
                    "l1" => (4 * KIB, 1),
                    "cache" => (32 * KIB, 1),
                    _ => (128 * KIB, (256 * MIB / (k * 128 * KIB)).max(1)),
                };
                let mut w = Workload::new(k, op, strip, stripes, &mut seed)?;
                w.verify(&impls)?;
                // Calls per sample for ~SAMPLE each (whole passes when streaming); doubles
                // as the warm-up.
                let calls = impls
                    .iter()
                    .map(|&imp| {
                        let probe = w.stripes.max(8);
                        let gbs = w.time(imp, probe).max(w.time(imp, probe));
                        let want = (gbs * 1e9 * SAMPLE.as_secs_f64() / w.bytes_per_call() as f64) as usize;
                        want.div_ceil(w.stripes).max(1) * w.stripes
                    })
                    .collect();
                rows.push(Row { mode, w, calls, samples: vec![Vec::new(); impls.len()] });
            }
        }
    }
    for _ in 0..REPS {
        for row in &mut rows {
            for (i, &imp) in impls.iter().enumerate() {
                let gbs = row.w.time(imp, row.calls[i]);
                row.samples[i].push(gbs);
            }
        }
    }
    let mut header: Vec<String> = ["regime", "shape", "op"].map(String::from).to_vec();
    header.extend(impls.iter().map(|i| i.name()));
    if reference.is_some() {
        header.push("ours/ISA-L".into());
    }
    let mut table = format!("\n| {} |\n|---|---|---|{}\n", header.join(" | "), "---:|".repeat(header.len() - 3));
    let mut figures = Vec::new();
    let (mut enc_ratio, mut dec_ratio) = (f64::INFINITY, f64::INFINITY);
    let ours_idx = impls.iter().position(|&i| i == Impl::Ours(detected)).unwrap_or(0);
    for row in &rows {
        let best: Vec<f64> = row.samples.iter().map(|s| s.iter().copied().fold(0.0, f64::max)).collect();
        let op = if row.w.op == Op::Encode { "encode" } else { "decode2" };
        let _ = write!(table, "| {} | {}+2 | {op} |", row.mode, row.w.k);
        for b in &best {
            let _ = write!(table, " {b:.1} |");
        }
        let isal_idx = impls.iter().position(|i| !matches!(i, Impl::Ours(_)));
        let ratio = isal_idx.map(|i| best[ours_idx] / best[i]);
        if let Some(r) = ratio {
            let _ = write!(table, " {r:.2} |");
            if row.w.op == Op::Encode {
                enc_ratio = enc_ratio.min(r);
            } else {
                dec_ratio = dec_ratio.min(r);
            }
        }
        table.push('\n');
        figures.push(json!({
            "regime": row.mode,
            "k": row.w.k,
            "m": 2,
            "op": op,
            "gbps_best": impls.iter().zip(&best).map(|(i, b)| (i.name(), json!(b))).collect::<serde_json::Map<_, _>>(),
            "gbps_median": impls.iter().zip(&row.samples).map(|(i, s)| (i.name(), json!(median(s)))).collect::<serde_json::Map<_, _>>(),
            "ratio_to_isal": ratio,
        }));
    }
    let _ = write!(out, "{table}");
    let r = |x: f64| if x.is_finite() { json!((x * 1000.0).round() / 1000.0) } else { Value::Null };
    let _ = writeln!(
        out,
        "\nworst ratio to ISA-L over shapes and regimes: encode {}, decode {}",
        r(enc_ratio),
        r(dec_ratio)
    );
    Ok(json!({
        "bench": "raid-kernel",
        "kernel": detected.name(),
        "reference": if reference.is_some() { json!("isa-l-2.32") } else { Value::Null },
        "rows": figures,
        "encode_ratio": r(enc_ratio),
        "decode_ratio": r(dec_ratio),
    }))
}
