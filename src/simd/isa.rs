//! Which instruction set the kernels run ([`Isa`], [`IsaLevel`]), decided in one place:
//! detected once, lowered by `ATTN_CPU_ISA` (a leaf).

/// A SIMD level, as a caller names it: what `ATTN_CPU_ISA` holds, what the kernels' per-call
/// knobs (`TiledConfig::isa`, the hidden `testing` module) ask for. Ordered: `Portable <
/// Avx2 < Avx512`. Asking is always safe: a level above what the CPU (or `ATTN_CPU_ISA`)
/// allows runs at the best level that is allowed (`Isa::at_most`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IsaLevel {
    /// Plain Rust, written so the compiler vectorises it for the target's baseline (SSE2 on
    /// x86-64, NEON on aarch64).
    Portable,
    /// AVX2 + FMA + F16C (the x86-64-v3 level): hand-written 256-bit micro-kernels.
    Avx2,
    /// AVX-512F on top of that level (with AVX-512 BW/VL and BF16 where a kernel needs them).
    Avx512,
}

impl IsaLevel {
    /// Every level, lowest first.
    pub const ALL: [IsaLevel; 3] = [IsaLevel::Portable, IsaLevel::Avx2, IsaLevel::Avx512];

    /// The name `ATTN_CPU_ISA` uses: `portable`, `avx2`, `avx512`.
    pub fn name(self) -> &'static str {
        match self {
            IsaLevel::Portable => "portable",
            IsaLevel::Avx2 => "avx2",
            IsaLevel::Avx512 => "avx512",
        }
    }

    /// The level named `s` (ASCII case and surrounding blanks ignored; `avx512f`, `avx-512`
    /// and `x86-64-v3`/`v4` accepted too), or `None`.
    pub fn parse(s: &str) -> Option<IsaLevel> {
        match s.trim().to_ascii_lowercase().as_str() {
            "portable" | "scalar" | "none" => Some(IsaLevel::Portable),
            "avx2" | "x86-64-v3" => Some(IsaLevel::Avx2),
            "avx512" | "avx512f" | "avx-512" | "x86-64-v4" => Some(IsaLevel::Avx512),
            _ => None,
        }
    }
}

impl std::fmt::Display for IsaLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The instruction set a kernel runs with: a proof that the CPU has it. `Avx512` and `Avx2`
/// are only ever constructed from [`hardware_best`]'s runtime checks (through [`Isa::get`] or
/// [`Isa::at_most`], which never go above them), which is what makes calling their
/// `#[target_feature]` functions sound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    Portable,
    /// AVX2, FMA and F16C detected.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX-512F detected, with everything `Avx2` needs.
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

/// The environment variable that lowers the instruction set of every kernel.
pub const ISA_ENV: &str = "ATTN_CPU_ISA";

/// The best instruction set this CPU has (checked once).
fn hardware_best() -> Isa {
    static BEST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *BEST.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            if avx2 && is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if avx2 {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    })
}

/// What `ATTN_CPU_ISA` says, read once: `Ok(None)` when unset or empty (or `auto`/`best`),
/// `Err(value)` for a value that names no level.
fn env_request() -> &'static Result<Option<IsaLevel>, String> {
    static REQUEST: std::sync::OnceLock<Result<Option<IsaLevel>, String>> =
        std::sync::OnceLock::new();
    REQUEST.get_or_init(|| match std::env::var(ISA_ENV) {
        Err(_) => Ok(None),
        Ok(v) if matches!(v.trim().to_ascii_lowercase().as_str(), "" | "auto" | "best") => Ok(None),
        Ok(v) => IsaLevel::parse(&v).map(Some).ok_or(v),
    })
}

impl Isa {
    /// The instruction set of this process, decided once: the best the CPU has
    /// ([`hardware_best`]), lowered to `ATTN_CPU_ISA` when that names a lower level. A level
    /// above the CPU's gives the CPU's best; a value that names no level is ignored (the best
    /// level runs) with one warning on stderr.
    pub(crate) fn get() -> Isa {
        static PROCESS: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *PROCESS.get_or_init(|| match env_request() {
            Ok(None) => hardware_best(),
            Ok(Some(level)) => hardware_best().capped(*level),
            Err(v) => {
                eprintln!(
                    "candle-attention: ignoring {ISA_ENV}={v:?} (expected portable, avx2 or \
                     avx512); using {}",
                    hardware_best().level()
                );
                hardware_best()
            }
        })
    }

    /// [`Isa::get`], or at most `level` when one is asked for: the per-call knob of the
    /// kernels (`TiledConfig::isa`, tests). Never above the process's level.
    pub(crate) fn at_most(level: Option<IsaLevel>) -> Isa {
        match level {
            None => Isa::get(),
            Some(level) => Isa::get().capped(level),
        }
    }

    /// The highest instruction set not above `self` and not above `level`.
    fn capped(self, level: IsaLevel) -> Isa {
        if self.level() <= level {
            return self;
        }
        match level {
            IsaLevel::Portable => Isa::Portable,
            // `self` is above AVX2, so AVX2 was detected too (`hardware_best`).
            #[cfg(target_arch = "x86_64")]
            IsaLevel::Avx2 => Isa::Avx2,
            _ => Isa::Portable,
        }
    }

    /// The level this instruction set is.
    pub(crate) fn level(self) -> IsaLevel {
        match self {
            Isa::Portable => IsaLevel::Portable,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => IsaLevel::Avx2,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => IsaLevel::Avx512,
        }
    }
}

/// The levels the kernels can run at in this process, lowest first: every level up to
/// the process's level (so `ATTN_CPU_ISA=portable` leaves only `Portable`).
pub fn available_levels() -> Vec<IsaLevel> {
    let top = Isa::get().level();
    IsaLevel::ALL.into_iter().filter(|&l| l <= top).collect()
}

/// Every instruction set the kernels can run at in this process, lowest first (the
/// [`available_levels`]): what the kernel tests loop over.
#[cfg(test)]
pub(crate) fn isas() -> Vec<Isa> {
    available_levels()
        .into_iter()
        .map(|l| Isa::at_most(Some(l)))
        .collect()
}

/// The level the kernels run at in this process (decided once, see [`crate::cpu`]).
pub fn active_level() -> IsaLevel {
    Isa::get().level()
}

/// The best level this CPU has, whatever `ATTN_CPU_ISA` says.
pub fn cpu_level() -> IsaLevel {
    hardware_best().level()
}

/// What this CPU offers the kernels, in one line: the best level, the x86 features the
/// kernels look for, and the level in use (with `ATTN_CPU_ISA` when set), e.g. `cpu: avx2
/// (avx2 fma f16c; no avx512f); kernels: avx2`.
pub fn describe_cpu() -> String {
    #[allow(unused_mut)]
    let mut have: Vec<&str> = Vec::new();
    #[allow(unused_mut)]
    let mut lack: Vec<&str> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        let features: [(&str, bool); 8] = [
            ("avx2", is_x86_feature_detected!("avx2")),
            ("fma", is_x86_feature_detected!("fma")),
            ("f16c", is_x86_feature_detected!("f16c")),
            ("avx512f", is_x86_feature_detected!("avx512f")),
            ("avx512bw", is_x86_feature_detected!("avx512bw")),
            ("avx512vl", is_x86_feature_detected!("avx512vl")),
            ("avx512bf16", is_x86_feature_detected!("avx512bf16")),
            ("avx512vnni", is_x86_feature_detected!("avx512vnni")),
        ];
        for (name, on) in features {
            if on {
                have.push(name);
            } else {
                lack.push(name);
            }
        }
    }
    let mut s = format!("cpu: {} ({}", cpu_level(), std::env::consts::ARCH);
    if !have.is_empty() {
        s += &format!(" {}", have.join(" "));
    }
    if !lack.is_empty() {
        s += &format!("; no {}", lack.join(" "));
    }
    s += &format!("); kernels: {}", active_level());
    match env_request() {
        Ok(Some(level)) => s += &format!(" ({ISA_ENV}={level})"),
        Err(v) => s += &format!(" ({ISA_ENV}={v:?} ignored)"),
        Ok(None) => {}
    }
    s
}
