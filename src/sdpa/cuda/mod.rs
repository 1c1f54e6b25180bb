//! The CUDA paths of attention: FlashAttention-2 from `candle-flash-attn` ([`flash`], feature
//! `flash-attn`) and the packing of key-padded batches into the variable-length layout it
//! takes ([`varlen`], device-generic tensor code, tested on every machine).

#[cfg(feature = "flash-attn")]
pub(crate) mod flash;
// Device-generic packing code; without `flash-attn` only its tests use it.
#[cfg_attr(not(feature = "flash-attn"), allow(dead_code))]
pub(crate) mod varlen;
