//! ISA detection tests, including proof that every tier this CPU can run is exercised by the
//! kernel tests (they iterate over `isa::supported()`).

use kwker_kernels::isa::{self, Isa};

#[test]
fn supported_starts_with_generic_and_is_ordered() {
    let s = isa::supported();
    assert_eq!(s.first(), Some(&Isa::Generic));
    assert!(s.windows(2).all(|w| w[0] < w[1]));
    assert!(s.iter().all(|i| i.is_supported()));
    assert!(s.contains(&isa::detect()));
    assert_eq!(isa::best(), *s.last().unwrap());
}

#[test]
fn names_round_trip() {
    for i in Isa::ALL {
        assert_eq!(Isa::from_name(i.name()), Some(i));
        assert_eq!(
            Isa::from_name(&format!(" {} ", i.name().to_uppercase())),
            Some(i)
        );
    }
    assert_eq!(Isa::from_name("avx"), None);
}

/// The SIMD tiers are tested exactly when the CPU has them, so the tests cannot silently
/// skip a tier this host supports. Set KWKER_EXPECT_ISA=avx2,avx512 (e.g. in CI on a known
/// machine) to also fail when the host unexpectedly lacks a tier.
#[test]
fn every_available_tier_is_exercised() {
    let s = isa::supported();
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        assert_eq!(s.contains(&Isa::Avx2), has!("avx2") && has!("fma"));
        let avx512 = has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512dq");
        assert_eq!(
            s.contains(&Isa::Avx512),
            avx512 && has!("avx2") && has!("fma")
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    assert_eq!(s, vec![Isa::Generic]);
    if let Ok(expect) = std::env::var("KWKER_EXPECT_ISA") {
        for name in expect.split(',').filter(|n| !n.trim().is_empty()) {
            let isa = Isa::from_name(name).unwrap_or_else(|| panic!("unknown tier {name}"));
            assert!(s.contains(&isa), "expected tier {name} on this host");
        }
    }
    eprintln!(
        "tiers exercised: {:?}",
        s.iter().map(|i| i.name()).collect::<Vec<_>>()
    );
}
