//! Placeholder scalar codec (replaced by the measured kernels).
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CodecError {
    BadShape { k: usize, m: usize },
    NotEnoughShards { present: usize, k: usize },
    BadIndex(usize),
}
impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}
impl std::error::Error for CodecError {}

const fn tables() -> ([u8; 512], [u8; 256]) {
    let mut exp = [0u8; 512];
    let mut log = [0u8; 256];
    let mut x: u16 = 1;
    let mut i = 0;
    while i < 255 {
        exp[i] = x as u8;
        exp[i + 255] = x as u8;
        log[x as usize] = i as u8;
        x <<= 1;
        if x & 0x100 != 0 {
            x ^= 0x11d;
        }
        i += 1;
    }
    (exp, log)
}
const T: ([u8; 512], [u8; 256]) = tables();
fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 { 0 } else { T.0[T.1[a as usize] as usize + T.1[b as usize] as usize] }
}
fn inv(a: u8) -> u8 {
    T.0[255 - T.1[a as usize] as usize]
}

fn invert(mut a: Vec<u8>, n: usize) -> Option<Vec<u8>> {
    let mut b = vec![0u8; n * n];
    for i in 0..n {
        b[i * n + i] = 1;
    }
    for c in 0..n {
        let p = (c..n).find(|&r| a[r * n + c] != 0)?;
        for j in 0..n {
            a.swap(c * n + j, p * n + j);
            b.swap(c * n + j, p * n + j);
        }
        let iv = inv(a[c * n + c]);
        for j in 0..n {
            a[c * n + j] = mul(a[c * n + j], iv);
            b[c * n + j] = mul(b[c * n + j], iv);
        }
        for r in 0..n {
            if r != c && a[r * n + c] != 0 {
                let f = a[r * n + c];
                for j in 0..n {
                    a[r * n + j] ^= mul(f, a[c * n + j]);
                    b[r * n + j] ^= mul(f, b[c * n + j]);
                }
            }
        }
    }
    Some(b)
}

fn dot(coeffs: &[u8], inputs: &[&[u8]], outputs: &mut [&mut [u8]], acc: bool) {
    let c = inputs.len();
    for (r, out) in outputs.iter_mut().enumerate() {
        if !acc {
            out.fill(0);
        }
        for (j, inp) in inputs.iter().enumerate() {
            let f = coeffs[r * c + j];
            for (o, i) in out.iter_mut().zip(inp.iter()) {
                *o ^= mul(f, *i);
            }
        }
    }
}

pub struct Codec {
    k: usize,
    m: usize,
    matrix: Vec<u8>,
}

pub struct Decoder {
    inputs: Vec<usize>,
    coeffs: Vec<u8>,
}

impl Decoder {
    pub fn inputs(&self) -> &[usize] {
        &self.inputs
    }
    pub fn apply(&self, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) {
        dot(&self.coeffs, inputs, outputs, false)
    }
}

impl Codec {
    pub fn new(k: usize, m: usize) -> Result<Codec, CodecError> {
        if k == 0 || k + m > 255 {
            return Err(CodecError::BadShape { k, m });
        }
        let mut matrix = vec![0u8; m * k];
        for i in 0..m {
            for j in 0..k {
                matrix[i * k + j] = inv(((k + i) ^ j) as u8);
            }
        }
        if m > 0 {
            for j in 0..k {
                let s = inv(matrix[j]);
                for i in 0..m {
                    matrix[i * k + j] = mul(matrix[i * k + j], s);
                }
            }
        }
        for i in 1..m {
            let s = inv(matrix[i * k]);
            for j in 0..k {
                matrix[i * k + j] = mul(matrix[i * k + j], s);
            }
        }
        Ok(Codec { k, m, matrix })
    }
    pub fn k(&self) -> usize {
        self.k
    }
    pub fn m(&self) -> usize {
        self.m
    }
    pub fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) {
        dot(&self.matrix, data, parity, false)
    }
    pub fn update(&self, j: usize, delta: &[u8], parity: &mut [&mut [u8]]) {
        let col: Vec<u8> = (0..self.m).map(|i| self.matrix[i * self.k + j]).collect();
        dot(&col, &[delta], parity, true)
    }
    fn row(&self, shard: usize) -> Vec<u8> {
        if shard < self.k {
            (0..self.k).map(|j| u8::from(j == shard)).collect()
        } else {
            self.matrix[(shard - self.k) * self.k..(shard - self.k + 1) * self.k].to_vec()
        }
    }
    pub fn decoder(&self, present: &[usize], wanted: &[usize]) -> Result<Decoder, CodecError> {
        let k = self.k;
        if let Some(&b) = present.iter().chain(wanted).find(|&&i| i >= k + self.m) {
            return Err(CodecError::BadIndex(b));
        }
        if present.len() < k {
            return Err(CodecError::NotEnoughShards { present: present.len(), k });
        }
        let inputs: Vec<usize> = present[..k].to_vec();
        let mut sub = Vec::with_capacity(k * k);
        for &s in &inputs {
            sub.extend(self.row(s));
        }
        let invm = invert(sub, k).ok_or(CodecError::NotEnoughShards { present: present.len(), k })?;
        let mut coeffs = Vec::new();
        for &w in wanted {
            let r = self.row(w);
            for c in 0..k {
                let mut v = 0;
                for t in 0..k {
                    v ^= mul(r[t], invm[t * k + c]);
                }
                coeffs.push(v);
            }
        }
        Ok(Decoder { inputs, coeffs })
    }
}

impl Codec {
    /// Read-modify-write for a subset of parity rows.
    pub fn update_rows(&self, j: usize, rows: &[usize], delta: &[u8], parity: &mut [&mut [u8]]) {
        let col: Vec<u8> = rows.iter().map(|&i| self.matrix[i * self.k + j]).collect();
        dot(&col, &[delta], parity, true)
    }
}

pub fn kernel_name() -> &'static str {
    "scalar"
}
