//! Per-block key/value cache for incremental decoding.
//!
//! Each decoding step projects only the new tokens' keys and values and appends them; attention
//! then reads the whole prefix. Appends write into a buffer whose capacity doubles when full, so
//! a step costs time proportional to the prefix it attends to, not to the square of it.

use candle::Tensor;

/// Keys and values `(B, H, S, head_dim)` of the tokens seen so far by one attention block.
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    /// `(B, H, capacity, head_dim)` buffers; positions `0..len` are valid.
    buffers: Option<(Tensor, Tensor)>,
    len: usize,
}

impl KvCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of cached positions `S`.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets everything.
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    /// Appends `k`, `v` `(B, H, T, head_dim)` and returns all cached keys and values
    /// `(B, H, S + T, head_dim)`. Batch, heads, head size, dtype and device must match what is
    /// cached. Under autograd (a tracked `k` or `v`) it concatenates instead of writing in place,
    /// so gradients are kept.
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> candle::Result<(Tensor, Tensor)> {
        let (b, h, t, d) = k.dims4()?;
        if v.dims4()?.0 != b || v.dim(1)? != h || v.dim(2)? != t {
            candle::bail!(
                "kv cache: keys {:?} and values {:?} disagree",
                k.dims(),
                v.dims()
            )
        }
        let Some((kb, vb)) = &self.buffers else {
            let (k, v) = (k.contiguous()?, v.contiguous()?);
            self.buffers = Some((k.clone(), v.clone()));
            self.len = t;
            return Ok((k, v));
        };
        let (cb, ch, cap, cd) = kb.dims4()?;
        if (cb, ch, cd) != (b, h, d) || vb.dim(3)? != v.dim(3)? || kb.dtype() != k.dtype() {
            candle::bail!(
                "kv cache holds keys {:?} ({:?}) and cannot take {:?} ({:?})",
                kb.narrow(2, 0, self.len)?.dims(),
                kb.dtype(),
                k.dims(),
                k.dtype()
            )
        }
        let new_len = self.len + t;
        if k.track_op() || v.track_op() || kb.track_op() {
            let k_all = Tensor::cat(&[&kb.narrow(2, 0, self.len)?, k], 2)?;
            let v_all = Tensor::cat(&[&vb.narrow(2, 0, self.len)?, v], 2)?;
            self.buffers = Some((k_all.clone(), v_all.clone()));
            self.len = new_len;
            return Ok((k_all, v_all));
        }
        // Full: move the valid prefix into buffers of at least twice the capacity.
        let (kb, vb) = if new_len > cap {
            let grow = |buf: &Tensor, x: &Tensor| -> candle::Result<Tensor> {
                let new_cap = new_len.max(2 * cap);
                let extra =
                    Tensor::zeros((b, h, new_cap - self.len, x.dim(3)?), x.dtype(), x.device())?;
                Tensor::cat(&[&buf.narrow(2, 0, self.len)?, &extra], 2)
            };
            (grow(kb, k)?, grow(vb, v)?)
        } else {
            (kb.clone(), vb.clone())
        };
        kb.slice_set(&k.contiguous()?, 2, self.len)?;
        vb.slice_set(&v.contiguous()?, 2, self.len)?;
        self.len = new_len;
        let views = (kb.narrow(2, 0, new_len)?, vb.narrow(2, 0, new_len)?);
        self.buffers = Some((kb, vb));
        Ok(views)
    }

    /// Keeps batch rows `rows` (e.g. the surviving beams), in that order: `(B', H, S, head_dim)`.
    pub fn select_rows(&mut self, rows: &Tensor) -> candle::Result<()> {
        if let Some((k, v)) = &self.buffers {
            let k = k
                .narrow(2, 0, self.len)?
                .contiguous()?
                .index_select(rows, 0)?;
            let v = v
                .narrow(2, 0, self.len)?
                .contiguous()?
                .index_select(rows, 0)?;
            self.buffers = Some((k, v));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle::{DType, Device};

    #[test]
    fn appends_grow_and_keep_everything() {
        let dev = Device::Cpu;
        let mut cache = KvCache::new();
        let mut all = Vec::new();
        for step in 0..9 {
            let k = Tensor::full(step as f32, (2, 3, 1, 4), &dev).unwrap();
            let (ks, vs) = cache.append(&k, &(&k * 2.0).unwrap()).unwrap();
            all.push(step as f32);
            assert_eq!(ks.dims(), &[2, 3, step + 1, 4]);
            let got: Vec<f32> = ks
                .get(1)
                .unwrap()
                .get(2)
                .unwrap()
                .narrow(1, 0, 1)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            assert_eq!(got, all);
            assert_eq!(vs.dims(), ks.dims());
        }
        let rows = Tensor::new(&[1u32, 1, 0], &dev).unwrap();
        cache.select_rows(&rows).unwrap();
        let (ks, _) = cache
            .append(
                &Tensor::zeros((3, 3, 2, 4), DType::F32, &dev).unwrap(),
                &Tensor::zeros((3, 3, 2, 4), DType::F32, &dev).unwrap(),
            )
            .unwrap();
        assert_eq!(ks.dims(), &[3, 3, 11, 4]);
        assert_eq!(cache.len(), 11);
        let err = cache.append(
            &Tensor::zeros((2, 3, 1, 4), DType::F32, &dev).unwrap(),
            &Tensor::zeros((2, 3, 1, 4), DType::F32, &dev).unwrap(),
        );
        assert!(err
            .unwrap_err()
            .to_string()
            .contains("cannot take [2, 3, 1, 4]"));
    }
}
