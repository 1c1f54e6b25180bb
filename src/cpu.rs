//! What the CPU offers the kernels, and the instruction-set level they run at.
//!
//! The level is decided once per process: the best the CPU has (AVX-512F, else AVX2 + FMA +
//! F16C, else the portable kernels), lowered by the environment variable `ATTN_CPU_ISA`
//! (`portable`, `avx2` or `avx512`, read once; a level above the CPU's runs the CPU's best, an
//! unknown value is ignored with one warning). Every CPU kernel (attention, projections,
//! conversions, the generation loops' row scans, activations and layer norm) dispatches on it.
//!
//! ```
//! use candle_attention::cpu;
//! println!("{}", cpu::describe_cpu()); // e.g. "cpu: avx2 (x86_64 avx2 fma f16c; no avx512f ...); kernels: avx2"
//! assert!(cpu::active_level() <= cpu::cpu_level());
//! ```

pub use crate::simd::{active_level, available_levels, cpu_level, describe_cpu, IsaLevel, ISA_ENV};
