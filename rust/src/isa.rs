//! Run-time instruction-set selection.
//!
//! Contract: a tier is only ever reported as supported when the CPU *and* the OS support every
//! feature its kernels are compiled with, so dispatching on a supported tier can never execute
//! an illegal instruction. `detect()` is computed once per process. `KWKER_ISA_MAX=<tier>` (read
//! once) makes every tier above it unsupported, as on a CPU without them: to test an AVX2-only
//! deployment, or the refusal of a missing tier, on a bigger CPU.

use std::sync::OnceLock;

/// A kernel tier. Ordered from least to most capable, so `max()` over supported tiers is the best.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Portable scalar Rust; the test oracle. Always available.
    Generic,
    /// x86-64 AVX2 + FMA (256-bit vectors).
    Avx2,
    /// AVX2 + FMA + F16C and AVX-VNNI (VEX `vpdpbusd`, 256-bit): the AVX2 kernels but for the
    /// quantized linears, which take `vpdpbusd` (client CPUs without AVX-512: Intel Alder Lake and
    /// later). Not implied by `Avx512` (Zen 4 has AVX-512 VNNI but not AVX-VNNI), so tiers are
    /// ordered by capability, each checked on its own.
    AvxVnni,
    /// x86-64 AVX-512 F/BW/VL/DQ + FMA (512-bit vectors, masked tails).
    Avx512,
    /// AVX-512 and AMX tiles (AMX-TILE, AMX-BF16, the OS's tile state granted to the process:
    /// Intel Sapphire Rapids and later): the AVX-512 kernels, but bf16 linears of many rows
    /// run on `tdpbf16ps` tiles (`amx::bf16_gemm`).
    Amx,
}

impl Isa {
    /// Every tier, least capable first.
    pub const ALL: [Isa; 5] = [Isa::Generic, Isa::Avx2, Isa::AvxVnni, Isa::Avx512, Isa::Amx];

    /// Lower-case name, as accepted by `KWKER_ISA`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Generic => "generic",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avxvnni",
            Isa::Avx512 => "avx512",
            Isa::Amx => "amx",
        }
    }

    /// Parses a tier name (case-insensitive, surrounding whitespace ignored).
    pub fn from_name(s: &str) -> Option<Isa> {
        let s = s.trim();
        Isa::ALL
            .into_iter()
            .find(|isa| isa.name().eq_ignore_ascii_case(s))
    }

    /// Whether this host can run the tier (and `KWKER_ISA_MAX` does not hide it).
    pub fn is_supported(self) -> bool {
        self <= ceiling() && self.cpu_has()
    }

    /// Whether the CPU and OS have every feature of the tier. The feature lists must match the
    /// `#[target_feature(enable = ...)]` strings used in the tier files.
    pub fn cpu_has(self) -> bool {
        match self {
            Isa::Generic => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::AvxVnni => {
                Isa::Avx2.cpu_has()
                    && std::arch::is_x86_feature_detected!("f16c")
                    && std::arch::is_x86_feature_detected!("avxvnni")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.cpu_has()
                    && std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512dq")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Amx => Isa::Avx512.cpu_has() && crate::amx::usable(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }
}

/// The highest tier `KWKER_ISA_MAX` allows (every tier when unset or not a tier name), read once.
pub fn ceiling() -> Isa {
    static CEILING: OnceLock<Isa> = OnceLock::new();
    *CEILING.get_or_init(|| {
        let request = std::env::var("KWKER_ISA_MAX").ok();
        match request.as_deref().map(str::trim).filter(|r| !r.is_empty()) {
            None => Isa::Amx,
            Some(r) => Isa::from_name(r).unwrap_or_else(|| {
                eprintln!(
                    "kwker: KWKER_ISA_MAX={r} is not one of generic|avx2|avxvnni|avx512|amx; ignored"
                );
                Isa::Amx
            }),
        }
    })
}

/// Every tier the host can run, `Generic` first.
pub fn supported() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|i| i.is_supported()).collect()
}

/// The best tier the host can run, ignoring `KWKER_ISA`.
pub fn best() -> Isa {
    supported().into_iter().max().unwrap_or(Isa::Generic)
}

/// The tier to use: the best supported one, unless `KWKER_ISA` forces another. Cached for the
/// process lifetime. An unknown or unsupported request falls back to the best tier with one
/// warning line on stderr (printed once, because the result is cached).
pub fn detect() -> Isa {
    static CHOICE: OnceLock<Isa> = OnceLock::new();
    *CHOICE.get_or_init(|| {
        let request = std::env::var("KWKER_ISA").ok();
        let (isa, warning) = resolve(request.as_deref(), best(), Isa::is_supported);
        if let Some(w) = warning {
            eprintln!("{w}");
        }
        isa
    })
}

/// Pure part of `detect()`: maps an optional request to a tier plus an optional warning.
/// Split out so the policy is testable without touching the process environment.
fn resolve(
    request: Option<&str>,
    best: Isa,
    is_supported: impl Fn(Isa) -> bool,
) -> (Isa, Option<String>) {
    let Some(req) = request.map(str::trim).filter(|r| !r.is_empty()) else {
        return (best, None);
    };
    match Isa::from_name(req) {
        Some(isa) if is_supported(isa) => (isa, None),
        Some(isa) => (
            best,
            Some(format!(
                "kwker: KWKER_ISA={req} asks for {} which this CPU does not support; using {}",
                isa.name(),
                best.name()
            )),
        ),
        None => (
            best,
            Some(format!(
                "kwker: KWKER_ISA={req} is not one of generic|avx2|avxvnni|avx512|amx; using {}",
                best.name()
            )),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_policy() {
        let only_avx2 = |i: Isa| i <= Isa::Avx2;
        assert_eq!(resolve(None, Isa::Avx2, only_avx2), (Isa::Avx2, None));
        assert_eq!(resolve(Some("  "), Isa::Avx2, only_avx2), (Isa::Avx2, None));
        assert_eq!(
            resolve(Some("Generic"), Isa::Avx2, only_avx2),
            (Isa::Generic, None)
        );
        let (isa, w) = resolve(Some("avx512"), Isa::Avx2, only_avx2);
        assert_eq!(isa, Isa::Avx2);
        assert!(w.unwrap().contains("avx512"));
        let (isa, w) = resolve(Some("sse9"), Isa::Avx2, only_avx2);
        assert_eq!(isa, Isa::Avx2);
        assert!(w.unwrap().contains("sse9"));
    }
}
