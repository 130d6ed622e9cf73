//! bf16 conversion tests against an independent bit-level reference of torch's
//! `c10::BFloat16` rounding (round to nearest, ties to even; every NaN -> 0x7FC0).

use kwker_kernels::bf16::{
    bf16_slice_to_f32, bf16_to_f32, f32_slice_to_bf16, f32_to_bf16, Bf16, Element,
};

/// Reference written differently from the crate's (explicit halfway comparison instead of a
/// rounding bias), so a shared mistake is unlikely.
fn reference(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7FC0;
    }
    let bits = x.to_bits();
    let upper = (bits >> 16) as u16;
    let lower = bits & 0xFFFF;
    let round_up = lower > 0x8000 || (lower == 0x8000 && upper & 1 == 1);
    // Carry out of the mantissa correctly bumps the exponent (and reaches inf at the top).
    if round_up {
        upper + 1
    } else {
        upper
    }
}

#[test]
fn every_upper_half_with_critical_lower_halves() {
    // Every sign/exponent/mantissa combination of the kept half, with the dropped half just
    // below, at, and just above the tie, plus extremes.
    let lowers = [0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFF];
    for upper in 0..=0xFFFFu32 {
        for &lower in &lowers {
            let x = f32::from_bits((upper << 16) | lower);
            let got = f32_to_bf16(x);
            assert_eq!(got, reference(x), "bits {:#010x}", x.to_bits());
        }
    }
}

#[test]
fn sampled_bit_patterns() {
    let mut bits = 0x1234_5678u32;
    for _ in 0..2_000_000 {
        bits = bits.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let x = f32::from_bits(bits);
        assert_eq!(f32_to_bf16(x), reference(x), "bits {bits:#010x}");
    }
}

#[test]
fn special_values() {
    assert_eq!(f32_to_bf16(0.0), 0x0000);
    assert_eq!(f32_to_bf16(-0.0), 0x8000);
    assert_eq!(f32_to_bf16(1.0), 0x3F80);
    assert_eq!(f32_to_bf16(f32::INFINITY), 0x7F80);
    assert_eq!(f32_to_bf16(f32::NEG_INFINITY), 0xFF80);
    // Every NaN (either sign, quiet or signalling, any payload) becomes the canonical quiet NaN.
    for nan in [
        0x7FC0_0000u32,
        0xFFC0_0000,
        0x7F80_0001,
        0xFF80_0001,
        0x7FFF_FFFF,
    ] {
        assert_eq!(f32_to_bf16(f32::from_bits(nan)), 0x7FC0, "{nan:#x}");
    }
    // Largest finite f32 rounds up to inf; the largest bf16 survives.
    assert_eq!(f32_to_bf16(f32::MAX), 0x7F80);
    assert_eq!(f32_to_bf16(f32::from_bits(0x7F7F_0000)), 0x7F7F);
    assert_eq!(f32_to_bf16(f32::from_bits(0x7F7F_7FFF)), 0x7F7F);
    // Tie at the largest bf16 (odd mantissa) rounds to even = inf.
    assert_eq!(f32_to_bf16(f32::from_bits(0x7F7F_8000)), 0x7F80);
    // Ties to even in the normal range: 1 + 2^-8 (tie, even below) and 1 + 3*2^-8 (tie, odd).
    assert_eq!(f32_to_bf16(f32::from_bits(0x3F80_8000)), 0x3F80);
    assert_eq!(f32_to_bf16(f32::from_bits(0x3F81_8000)), 0x3F82);
    // Subnormals are rounded, not flushed.
    assert_eq!(f32_to_bf16(f32::from_bits(0x0000_8000)), 0x0000);
    assert_eq!(f32_to_bf16(f32::from_bits(0x0001_8000)), 0x0002);
    assert_eq!(f32_to_bf16(f32::from_bits(0x0001_0000)), 0x0001);
}

#[test]
fn widening_is_exact_and_round_trips() {
    for b in 0..=0xFFFFu16 {
        let x = bf16_to_f32(b);
        assert_eq!(x.to_bits(), (b as u32) << 16);
        if !x.is_nan() {
            assert_eq!(f32_to_bf16(x), b);
        }
    }
}

#[test]
fn slices_match_scalar_conversions() {
    for len in [0, 1, 7, 8, 9, 31, 64, 100] {
        let src: Vec<f32> = (0..len).map(|i| (i as f32 * 0.377).sin() * 1e3).collect();
        let mut narrow = vec![0u16; len];
        f32_slice_to_bf16(&src, &mut narrow);
        for (s, n) in src.iter().zip(&narrow) {
            assert_eq!(*n, f32_to_bf16(*s));
        }
        let mut wide = vec![0.0f32; len];
        bf16_slice_to_f32(&narrow, &mut wide);
        for (n, w) in narrow.iter().zip(&wide) {
            assert_eq!(w.to_bits(), bf16_to_f32(*n).to_bits());
        }
    }
}

#[test]
#[should_panic(expected = "destination")]
fn slice_length_mismatch_panics() {
    let mut dst = [0u16; 3];
    f32_slice_to_bf16(&[1.0; 4], &mut dst);
}

#[test]
fn element_impls() {
    assert_eq!(<f32 as Element>::from_f32(1.5).to_f32(), 1.5);
    assert_eq!(Bf16::from_f32(1.5), Bf16(0x3FC0));
    assert_eq!(Bf16(0x3FC0).to_f32(), 1.5);
    assert_eq!(Bf16::default(), Bf16(0));
}
