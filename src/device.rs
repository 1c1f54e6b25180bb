//! Choosing a candle device by name, with an error that says what to do when the backend is
//! not compiled in (rather than candle's generic "not compiled with cuda support").

use candle::Device;

/// The device named `name`: `cpu`, `cuda` / `cuda:N`, `metal` / `metal:N` (ordinal `N`,
/// default 0; case-insensitive, surrounding spaces ignored).
///
/// Errors: an unknown name (listing the accepted ones), a backend this build does not have
/// (naming the cargo feature that enables it), or a device the backend cannot open (candle's
/// reason, e.g. no GPU present).
///
/// ```
/// let cpu = candle_attention::device_from_name("cpu")?;
/// assert!(cpu.is_cpu());
/// assert!(candle_attention::device_from_name("tpu").is_err());
/// # Ok::<(), candle::Error>(())
/// ```
pub fn device_from_name(name: &str) -> candle::Result<Device> {
    let lower = name.trim().to_ascii_lowercase();
    let (kind, ordinal) = match lower.split_once(':') {
        Some((kind, n)) => match n.parse::<usize>() {
            Ok(n) => (kind, n),
            Err(_) => candle::bail!("device {name:?}: the ordinal after ':' must be a number"),
        },
        None => (lower.as_str(), 0),
    };
    match kind {
        "cpu" if ordinal == 0 => Ok(Device::Cpu),
        "cpu" => candle::bail!("device {name:?}: the CPU has no ordinal"),
        "cuda" => {
            if !candle::utils::cuda_is_available() {
                candle::bail!(
                    "device {name:?}: this build has no CUDA support; rebuild with `--features cuda` \
                     (needs the CUDA toolkit's nvcc) on a machine with an NVIDIA GPU"
                )
            }
            Device::new_cuda(ordinal)
                .map_err(|e| candle::Error::Msg(format!("cannot open CUDA device {ordinal}: {e}")))
        }
        "metal" => {
            if !candle::utils::metal_is_available() {
                candle::bail!(
                    "device {name:?}: this build has no Metal support; rebuild with `--features metal` \
                     on macOS"
                )
            }
            Device::new_metal(ordinal)
                .map_err(|e| candle::Error::Msg(format!("cannot open Metal device {ordinal}: {e}")))
        }
        _ => candle::bail!("unknown device {name:?}: expected cpu, cuda, cuda:N, metal or metal:N"),
    }
}

/// The memory this machine can still give a process, in bytes (`MemAvailable` of
/// `/proc/meminfo`); `None` where that is not known (not Linux, or unreadable). Used to refuse
/// work that cannot fit before allocating it, instead of being killed or aborting.
pub fn available_memory() -> Option<u64> {
    proc_kib("/proc/meminfo", "MemAvailable")
}

/// This process's resident set, in bytes (`VmRSS` of `/proc/self/status`); `None` where that
/// is not known (not Linux, or unreadable). `attn serve` sizes its batches from it at rest.
pub fn resident_memory() -> Option<u64> {
    proc_kib("/proc/self/status", "VmRSS")
}

/// The `KEY:  N kB` line of a `/proc` file, in bytes.
fn proc_kib(path: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| {
        l.strip_prefix(key)
            .is_some_and(|rest| rest.starts_with(':'))
    })?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_os = "linux")]
    fn linux_says_the_resident_set() {
        let rss = resident_memory().expect("VmRSS");
        assert!(rss > 100_000, "{rss}");
    }

    #[test]
    fn names_parse_and_missing_backends_say_which_feature() {
        assert!(device_from_name(" CPU ").unwrap().is_cpu());
        let err = device_from_name("gpu").unwrap_err().to_string();
        assert!(err.contains("expected cpu, cuda"), "{err}");
        assert!(device_from_name("cuda:x").is_err());
        assert!(device_from_name("cpu:1").is_err());
        if !candle::utils::cuda_is_available() {
            let err = device_from_name("cuda").unwrap_err().to_string();
            assert!(err.contains("--features cuda"), "{err}");
        }
        if !candle::utils::metal_is_available() {
            let err = device_from_name("metal:0").unwrap_err().to_string();
            assert!(err.contains("--features metal"), "{err}");
        }
    }
}
