//! Borrowing a CPU tensor's elements in place: `f32` ([`cpu_f32`]) and half-precision bit
//! patterns ([`cpu_half_bits`]) (a leaf).

use candle::Storage;

/// The `f32` elements of a CPU storage (the whole buffer: index it from the layout's start
/// offset). An error for other devices or dtypes.
pub(crate) fn cpu_f32(storage: &Storage) -> candle::Result<&[f32]> {
    match storage {
        Storage::Cpu(s) => s.as_slice::<f32>(),
        _ => candle::bail!(
            "the CPU kernels (tiled attention, packed projection) run on CPU tensors only"
        ),
    }
}

/// The elements of a CPU f16 or bf16 storage as their 16-bit patterns (the whole buffer: index
/// it from the layout's start offset). An error for other devices or dtypes.
pub(crate) fn cpu_half_bits(storage: &Storage) -> candle::Result<&[u16]> {
    use half::slice::HalfFloatSliceExt;
    match storage {
        Storage::Cpu(candle::CpuStorage::F16(x)) => Ok(x.reinterpret_cast()),
        Storage::Cpu(candle::CpuStorage::BF16(x)) => Ok(x.reinterpret_cast()),
        Storage::Cpu(_) => candle::bail!(
            "the half-precision CPU kernels need f16 or bf16 tensors, got {:?}",
            storage.dtype()
        ),
        _ => candle::bail!(
            "the CPU kernels (tiled attention, half-precision projection) run on CPU tensors only"
        ),
    }
}
