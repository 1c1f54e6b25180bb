"""Limiting every side of a benchmark to one instruction-set level, like for like on a CPU that
has more: `ATTN_CPU_ISA` for candle-attention, `ATEN_CPU_CAPABILITY` and
`MKL_ENABLE_INSTRUCTIONS` for torch, `CT2_FORCE_CPU_ISA` and `ONEDNN_MAX_CPU_ISA` for
CTranslate2. The libraries read these when they load, so `reexec_with_isa_limits()` (called
before importing any of them) re-executes the script with them set when `--isa LEVEL` is on its
command line; the child sees CANDLE_ATTN_ISA_SET and does not loop.
"""
import os
import sys

ISA_ENV = {
    "portable": {"ATTN_CPU_ISA": "portable", "ATEN_CPU_CAPABILITY": "default",
                 "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "CT2_FORCE_CPU_ISA": "GENERIC",
                 "ONEDNN_MAX_CPU_ISA": "SSE41"},
    "avx2": {"ATTN_CPU_ISA": "avx2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "CT2_FORCE_CPU_ISA": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "avx512": {"ATTN_CPU_ISA": "avx512", "ATEN_CPU_CAPABILITY": "avx512",
               "MKL_ENABLE_INSTRUCTIONS": "AVX512", "CT2_FORCE_CPU_ISA": "AVX512",
               "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
}


def isa_from_argv(argv):
    """The LEVEL of `--isa LEVEL` / `--isa=LEVEL` in `argv`, or None."""
    for i, arg in enumerate(argv):
        if arg == "--isa" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--isa="):
            return arg.split("=", 1)[1]
    return None


def reexec_with_isa_limits():
    """Re-executes this script with the limits of its `--isa` level set (once)."""
    isa = isa_from_argv(sys.argv[1:])
    if isa in ISA_ENV and os.environ.get("CANDLE_ATTN_ISA_SET") != isa:
        os.execve(sys.executable, [sys.executable] + sys.argv,
                  dict(os.environ, CANDLE_ATTN_ISA_SET=isa, **ISA_ENV[isa]))
