//! Numeric kernels of Engram's embedding model, in their own crate so that they are compiled
//! with optimisations in every profile: the app's own code is built unoptimised for tests, and
//! there a matrix product written with SIMD intrinsics crawls (the held-out classifier test,
//! which embeds 871 texts: 14 s with this crate optimised, over 3 minutes without).
//!
//! # Dense layers
//!
//! [`Dense`] computes `y = x · Wᵀ + b` with its weights packed once, in the order its product
//! reads them. candle's `Linear` calls the `gemm` crate, which packs the weights into its own
//! block order on every call: for a batch of memories (hundreds of token rows) that is paid once
//! over much work, but a search query is a dozen rows, and there the packing and the generic
//! kernel's set-up were half of the time (`gemm` reached about 30 GFLOP/s on one core of this
//! machine at 12 rows; this kernel, with f32 weights, about 57, and the same as `gemm` at
//! hundreds of rows).
//!
//! The weights sit in panels of 16 output columns, each panel's 16 weights of one input
//! adjacent; an AVX2 + FMA kernel keeps a 6 × 16 block of the output in 12 registers while it
//! walks the input dimension: per input value, one load of 16 weights and six broadcasts feed
//! twelve fused multiply-adds. Machines without AVX2, FMA and F16C get the same arithmetic in
//! plain Rust.
//!
//! The weights are stored as f16 and widened to f32 as they are loaded (F16C); inputs, products
//! and sums stay f32. A query's product is bound by reading the weights (the model's 42 MB of
//! f32 weights do not fit this machine's 32 MB L3, and every query reads them all), so half the
//! bytes is most of the gain: the six layers' products at 12 rows took 4.2 ms with f32 weights
//! and 2.9 ms with f16, and 91 against 88 ms at 400 rows. Rounding a weight to f16 changes it
//! by at most 2⁻¹¹ of itself (the model's weights are far inside f16's range); the vectors still
//! match sentence-transformers' (the app's parity test). Sums run in another order than
//! `gemm`'s, so results also differ from candle's in the last bits of an f32.

/// Output columns per panel (two AVX registers of 8 floats).
pub const NR: usize = 16;
/// Input rows per block of the kernel.
const MR: usize = 6;

/// A linear layer's weights, packed.
pub struct Dense {
    /// Output features.
    n: usize,
    /// Input features.
    k: usize,
    /// `n / NR` panels, each `k` rows of `NR` weights (f16 bits): `data[(p·k + i)·NR + c]` is
    /// the weight of input `i` for output `p·NR + c`.
    data: Vec<u16>,
    bias: Vec<f32>,
}

/// Why a layer cannot be packed.
#[derive(Debug, PartialEq)]
pub enum ShapeError {
    /// `n` is not a multiple of [`NR`].
    Outputs(usize),
    /// The weights are not `n × k`, or the bias not `n` long.
    Lengths,
}

impl std::fmt::Display for ShapeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Outputs(n) => write!(f, "{n} outputs is not a multiple of {NR}"),
            Self::Lengths => write!(f, "the weights or the bias do not have the layer's shape"),
        }
    }
}

impl std::error::Error for ShapeError {}

impl Dense {
    /// Packs a PyTorch-layout weight (`n × k` row-major, one row per output) and its bias.
    pub fn new(weight: &[f32], n: usize, k: usize, bias: &[f32]) -> Result<Self, ShapeError> {
        if !n.is_multiple_of(NR) {
            return Err(ShapeError::Outputs(n));
        }
        if weight.len() != n * k || bias.len() != n {
            return Err(ShapeError::Lengths);
        }
        let mut data = vec![0; n * k];
        for j in 0..n {
            let (p, c) = (j / NR, j % NR);
            for i in 0..k {
                data[(p * k + i) * NR + c] = half::f16::from_f32(weight[j * k + i]).to_bits();
            }
        }
        Ok(Self {
            n,
            k,
            data,
            bias: bias.to_vec(),
        })
    }

    /// Output features.
    pub fn outputs(&self) -> usize {
        self.n
    }

    /// Input features.
    pub fn inputs(&self) -> usize {
        self.k
    }

    /// `y` (m × n) = `x` (m × k) · Wᵀ + b, rows row-major.
    ///
    /// # Panics
    /// If `x` is not `m × k` or `y` not `m × n`.
    pub fn apply(&self, x: &[f32], m: usize, y: &mut [f32]) {
        assert_eq!(x.len(), m * self.k, "dense layer: input length");
        assert_eq!(y.len(), m * self.n, "dense layer: output length");
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            // SAFETY: the CPU has AVX2, FMA and F16C (checked above); the lengths were asserted, and
            // `data` holds n · k weights (`new`), so every pointer below stays in its slice.
            unsafe { self.apply_avx2(x, m, y) };
            return;
        }
        self.apply_portable(x, m, y);
    }

    /// The kernel's arithmetic in plain Rust (machines without AVX2, FMA and F16C, and the
    /// tests).
    pub fn apply_portable(&self, x: &[f32], m: usize, y: &mut [f32]) {
        assert_eq!(x.len(), m * self.k, "dense layer: input length");
        assert_eq!(y.len(), m * self.n, "dense layer: output length");
        let (k, n) = (self.k, self.n);
        for r in 0..m {
            let row = &x[r * k..(r + 1) * k];
            for p in 0..n / NR {
                let panel = &self.data[p * k * NR..(p + 1) * k * NR];
                let mut acc = [0.0f32; NR];
                for (i, &v) in row.iter().enumerate() {
                    for (a, w) in acc.iter_mut().zip(&panel[i * NR..(i + 1) * NR]) {
                        *a = v.mul_add(half::f16::from_bits(*w).to_f32(), *a);
                    }
                }
                for (c, a) in acc.iter().enumerate() {
                    y[r * n + p * NR + c] = a + self.bias[p * NR + c];
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn apply_avx2(&self, x: &[f32], m: usize, y: &mut [f32]) {
        use std::arch::x86_64::*;
        let (k, n) = (self.k, self.n);
        for p in 0..n / NR {
            let panel = self.data.as_ptr().add(p * k * NR);
            let b0 = _mm256_loadu_ps(self.bias.as_ptr().add(p * NR));
            let b1 = _mm256_loadu_ps(self.bias.as_ptr().add(p * NR + 8));
            let mut r0 = 0;
            while r0 < m {
                let rows = (m - r0).min(MR);
                let xp = x.as_ptr().add(r0 * k);
                let mut acc = [[_mm256_setzero_ps(); 2]; MR];
                // One loop per block height, so each is unrolled with its accumulators in
                // registers.
                macro_rules! block {
                    ($rows:expr) => {
                        for i in 0..k {
                            let h = _mm256_loadu_si256(panel.add(i * NR) as *const __m256i);
                            let w0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
                            let w1 = _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h));
                            for r in 0..$rows {
                                let v = _mm256_broadcast_ss(&*xp.add(r * k + i));
                                acc[r][0] = _mm256_fmadd_ps(v, w0, acc[r][0]);
                                acc[r][1] = _mm256_fmadd_ps(v, w1, acc[r][1]);
                            }
                        }
                    };
                }
                match rows {
                    6 => block!(6),
                    5 => block!(5),
                    4 => block!(4),
                    3 => block!(3),
                    2 => block!(2),
                    _ => block!(1),
                }
                for (r, a) in acc.iter().enumerate().take(rows) {
                    let out = y.as_mut_ptr().add((r0 + r) * n + p * NR);
                    _mm256_storeu_ps(out, _mm256_add_ps(a[0], b0));
                    _mm256_storeu_ps(out.add(8), _mm256_add_ps(a[1], b1));
                }
                r0 += rows;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (no dependency): values in [-1, 1).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn matches_the_definition_for_every_block_height() {
        for (n, k) in [(32, 24), (48, 384), (16, 5), (16, 1536)] {
            let (w, b) = (values(n * k, 1), values(n, 2));
            let dense = Dense::new(&w, n, k, &b).unwrap();
            // 1 to 13 rows: every height of the last block, and more than one block.
            for m in 1..=13 {
                let x = values(m * k, 3 + m as u64);
                let (mut fast, mut portable) = (vec![0.0; m * n], vec![0.0; m * n]);
                dense.apply(&x, m, &mut fast);
                dense.apply_portable(&x, m, &mut portable);
                for r in 0..m {
                    for j in 0..n {
                        // Exact, with the weights as stored (rounded to f16).
                        let exact: f64 = b[j] as f64
                            + (0..k)
                                .map(|i| {
                                    let w = half::f16::from_f32(w[j * k + i]).to_f32();
                                    x[r * k + i] as f64 * w as f64
                                })
                                .sum::<f64>();
                        // And against the f32 weights: each off by at most 2^-11 of itself.
                        let bound: f64 = (0..k)
                            .map(|i| (x[r * k + i] * w[j * k + i]).abs() as f64)
                            .sum::<f64>()
                            / 2048.0;
                        let full: f64 = b[j] as f64
                            + (0..k)
                                .map(|i| x[r * k + i] as f64 * w[j * k + i] as f64)
                                .sum::<f64>();
                        assert!((exact - full).abs() <= bound + 1e-9);
                        for (what, v) in [
                            ("kernel", fast[r * n + j]),
                            ("portable", portable[r * n + j]),
                        ] {
                            assert!(
                                (v as f64 - exact).abs() <= 1e-5 * (k as f64).sqrt(),
                                "{what} ({m}×{k})·({k}×{n}) [{r}][{j}]: {v} vs {exact}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn refuses_shapes_it_cannot_pack() {
        assert_eq!(
            Dense::new(&[0.0; 80], 10, 8, &[0.0; 10]).err(),
            Some(ShapeError::Outputs(10))
        );
        assert_eq!(
            Dense::new(&[0.0; 100], 16, 8, &[0.0; 16]).err(),
            Some(ShapeError::Lengths)
        );
        assert_eq!(
            Dense::new(&[0.0; 128], 16, 8, &[0.0; 15]).err(),
            Some(ShapeError::Lengths)
        );
    }

    #[test]
    #[should_panic(expected = "input length")]
    fn a_short_input_is_refused_before_any_read() {
        let dense = Dense::new(&[0.0; 128], 16, 8, &[0.0; 16]).unwrap();
        dense.apply(&[0.0; 15], 2, &mut [0.0; 32]);
    }
}
