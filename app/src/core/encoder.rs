//! One BERT encoder layer (all-MiniLM-L6-v2's six), as candle-transformers' `BertLayer` computes
//! it, with three changes:
//!
//! - the query, key and value projections are one matrix product (their weights stacked), not
//!   three: a search query is a dozen tokens, where each product's fixed cost counts;
//! - the four products are our `dense::Dense` (weights packed once at load and stored as f16),
//!   not candle's `Linear`: the one change that moves the vectors, which stay at cosine
//!   0.9999997 or more to sentence-transformers' on the parity set;
//! - GELU's `erf` is a polynomial (Abramowitz and Stegun 7.1.26, absolute error under 1.5e-7,
//!   the size of an f32 rounding) with an inlined `exp`, instead of the `libm` crate's `erff`:
//!   measured with `perf`, that call was 16 % of a query's embedding and, with the `expf` it
//!   calls, a quarter of a batch's.
//!
//! The parity test (`embed::tests::vectors_match_the_reference_implementation`, cosine above
//! 0.9999 with sentence-transformers) covers it.
use candle_core::{Module, Result, Tensor};
use candle_nn::{layer_norm, linear, LayerNorm, Linear, VarBuilder};
use candle_transformers::models::bert::Config;

use super::dense::Dense;

/// One encoder layer's weights.
pub struct Layer {
    /// Query, key and value projections stacked: (3 × hidden) × hidden.
    qkv: Dense,
    attention_out: Dense,
    attention_norm: LayerNorm,
    intermediate: Dense,
    output: Dense,
    output_norm: LayerNorm,
    heads: usize,
    head_size: usize,
}

impl Layer {
    /// Loads layer `vb` (`encoder.layer.N`) of a BERT checkpoint.
    pub fn load(vb: VarBuilder, config: &Config) -> Result<Self> {
        let hidden = config.hidden_size;
        let attention = vb.pp("attention");
        let projections = ["query", "key", "value"]
            .map(|name| linear(hidden, hidden, attention.pp("self").pp(name)));
        let [q, k, v] = projections;
        let (q, k, v) = (q?, k?, v?);
        let weight = Tensor::cat(&[q.weight(), k.weight(), v.weight()], 0)?;
        let bias = Tensor::cat(
            &[
                q.bias().expect("BERT projections have biases"),
                k.bias().expect("BERT projections have biases"),
                v.bias().expect("BERT projections have biases"),
            ],
            0,
        )?;
        Ok(Self {
            qkv: Dense::new(&weight, &bias)?,
            attention_out: dense(linear(hidden, hidden, attention.pp("output").pp("dense"))?)?,
            attention_norm: layer_norm(
                hidden,
                config.layer_norm_eps,
                attention.pp("output").pp("LayerNorm"),
            )?,
            intermediate: dense(linear(
                hidden,
                config.intermediate_size,
                vb.pp("intermediate").pp("dense"),
            )?)?,
            output: dense(linear(
                config.intermediate_size,
                hidden,
                vb.pp("output").pp("dense"),
            )?)?,
            output_norm: layer_norm(
                hidden,
                config.layer_norm_eps,
                vb.pp("output").pp("LayerNorm"),
            )?,
            heads: config.num_attention_heads,
            head_size: hidden / config.num_attention_heads,
        })
    }

    /// `hidden` (n, len, hidden) through the layer; `blocked` (n, 1, 1, len) is 0 where a token
    /// is attended and the lowest float where it is padding.
    pub fn forward(&self, hidden: &Tensor, blocked: &Tensor) -> Result<Tensor> {
        let (n, len, size) = hidden.dims3()?;
        // (n, len, 3, heads, head) -> three (n, heads, len, head).
        let qkv = self
            .qkv
            .forward(hidden)?
            .reshape((n, len, 3, self.heads, self.head_size))?;
        let part = |i: usize| {
            qkv.narrow(2, i, 1)?
                .squeeze(2)?
                .transpose(1, 2)?
                .contiguous()
        };
        let (q, k, v) = (part(0)?, part(1)?, part(2)?);
        let scores = (q.matmul(&k.t()?)? / (self.head_size as f64).sqrt())?;
        let probs = candle_nn::ops::softmax_last_dim(&scores.broadcast_add(blocked)?)?;
        let context = probs
            .matmul(&v)?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((n, len, size))?;
        let attended = self
            .attention_norm
            .forward(&(self.attention_out.forward(&context)? + hidden)?)?;
        let inner = gelu(&self.intermediate.forward(&attended)?)?;
        self.output_norm
            .forward(&(self.output.forward(&inner)? + &attended)?)
    }
}

/// A checkpoint's linear layer, packed for our product.
fn dense(linear: Linear) -> Result<Dense> {
    Dense::new(
        linear.weight(),
        linear.bias().expect("BERT's linear layers have biases"),
    )
}

/// GELU, `x · Φ(x)` with the exact (erf) form, elementwise.
fn gelu(xs: &Tensor) -> Result<Tensor> {
    let mut values = xs.flatten_all()?.to_vec1::<f32>()?;
    for x in &mut values {
        *x = 0.5 * *x * (1.0 + erf(*x * std::f32::consts::FRAC_1_SQRT_2));
    }
    Tensor::from_vec(values, xs.shape(), xs.device())
}

/// erf by Abramowitz and Stegun 7.1.26: absolute error under 1.5e-7 everywhere.
#[inline]
fn erf(x: f32) -> f32 {
    // The published coefficients as printed (f32 rounds the last digits).
    #[allow(clippy::excessive_precision)]
    const P: f32 = 0.327_591_1;
    #[allow(clippy::excessive_precision)]
    const A: [f32; 5] = [
        0.254_829_592,
        -0.284_496_736,
        1.421_413_741,
        -1.453_152_027,
        1.061_405_429,
    ];
    let a = x.abs();
    let t = 1.0 / (1.0 + P * a);
    let poly = t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * A[4]))));
    let y = 1.0 - poly * exp_negative(-a * a);
    y.copysign(x)
}

/// `exp(x)` for x ≤ 0 (relative error about 2e-7): 2^k · e^r with |r| ≤ ln 2 / 2
/// and a degree-6 polynomial for e^r, with no call, so a loop of it vectorises.
#[inline]
fn exp_negative(x: f32) -> f32 {
    // Below -87 the result is about 1e-38 instead of 0: as good for erf, and no branch.
    let x = x.max(-87.0);
    // Rounded to the nearest integer by adding and taking away 1.5 · 2^23 (no call to `round`).
    const ROUND: f32 = 12_582_912.0;
    let k = (x * std::f32::consts::LOG2_E + ROUND) - ROUND;
    // ln 2 in two parts, so r keeps its precision.
    let r = x - k * 0.693_145_75 - k * 1.428_606_8e-6;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    p * f32::from_bits(((k as i32 + 127) as u32) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_matches_candles_exact_gelu() {
        let xs: Vec<f32> = (-8000..=8000).map(|i| i as f32 / 1000.0).collect();
        let t = Tensor::new(xs.as_slice(), &candle_core::Device::Cpu).unwrap();
        let ours = gelu(&t).unwrap().to_vec1::<f32>().unwrap();
        let exact = t.gelu_erf().unwrap().to_vec1::<f32>().unwrap();
        for ((x, a), b) in xs.iter().zip(&ours).zip(&exact) {
            assert!(
                (a - b).abs() <= 1e-6 * x.abs().max(1.0),
                "gelu({x}) {a} vs {b}"
            );
        }
        assert_eq!(erf(10.0), 1.0);
        assert_eq!(erf(-10.0), -1.0);
    }

    #[test]
    fn exp_is_as_exact_as_f32() {
        for i in 0..=87_000 {
            let x = -(i as f32) / 1000.0;
            let (ours, exact) = (exp_negative(x), x.exp());
            assert!(
                (ours - exact).abs() <= 4e-7 * exact,
                "exp({x}) {ours} vs {exact}"
            );
        }
    }
}
