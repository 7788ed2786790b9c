//! The model's dense layers on candle tensors: [`kernels::Dense`] (weights packed once at load,
//! stored as f16, our own product; its crate tells why) behind candle's shapes.
use candle_core::{Result, Tensor};

/// A linear layer of the checkpoint, packed.
pub struct Dense(kernels::Dense);

impl Dense {
    /// Packs a PyTorch-layout weight (`n × k`, one row per output) and its bias.
    pub fn new(weight: &Tensor, bias: &Tensor) -> Result<Self> {
        let (n, k) = weight.dims2()?;
        let w = weight.flatten_all()?.to_vec1::<f32>()?;
        let b = bias.flatten_all()?.to_vec1::<f32>()?;
        kernels::Dense::new(&w, n, k, &b)
            .map(Self)
            .map_err(|e| candle_core::Error::Msg(format!("dense layer: {e}")))
    }

    /// `xs` (…, k) to (…, n).
    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let dims = xs.dims();
        let (k, n) = (self.0.inputs(), self.0.outputs());
        let Some((&last, lead)) = dims.split_last() else {
            candle_core::bail!("dense layer: a scalar input");
        };
        if last != k {
            candle_core::bail!("dense layer: {last} inputs, {k} expected");
        }
        let x = xs.flatten_all()?.to_vec1::<f32>()?;
        let m = x.len() / k;
        let mut y = vec![0.0; m * n];
        self.0.apply(&x, m, &mut y);
        let mut shape = lead.to_vec();
        shape.push(n);
        Tensor::from_vec(y, shape, xs.device())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn agrees_with_candles_linear_and_keeps_the_leading_dimensions() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 0.1, (48, 384), &dev).unwrap();
        let b = Tensor::randn(0f32, 0.1, 48, &dev).unwrap();
        let dense = Dense::new(&w, &b).unwrap();
        let x = Tensor::randn(0f32, 1.0, (2, 7, 384), &dev).unwrap();
        let ours = dense.forward(&x).unwrap();
        assert_eq!(ours.dims(), &[2, 7, 48]);
        // The weights as the kernel stores them (f16), in candle's product.
        let w = w
            .to_dtype(candle_core::DType::F16)
            .unwrap()
            .to_dtype(candle_core::DType::F32)
            .unwrap();
        let theirs = candle_nn::Linear::new(w, Some(b));
        let theirs = candle_core::Module::forward(&theirs, &x).unwrap();
        let diff = (ours - theirs)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(diff < 1e-4, "largest difference {diff}");
        let wrong = Tensor::randn(0f32, 1.0, (3, 100), &dev).unwrap();
        assert!(dense.forward(&wrong).is_err());
    }
}
