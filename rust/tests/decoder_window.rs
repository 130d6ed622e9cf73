//! Sliding-window layers keep only their window (`decoder/cache.rs`), in every cache format (f32,
//! bf16, q8): a decoder whose windowed layer holds 74 positions (window 3, `KEEP` 64, two chunks of 4 rows) gives the same logits, bit for bit,
//! as one whose layers hold the whole context, over 150 tokens (two moves of the window's keys), after
//! a truncate back past the window's edge within `KEEP`, and in a slot given a prefix by `copy_prefix`;
//! a truncate further back than the kept keys is refused with a message naming what to do, and the
//! cache's bytes say what each layer holds.

mod common;

use common::recipes::{base, build_with};
use kwker_kernels::decoder::recipe::{KvFormat, Limits};
use kwker_kernels::decoder::{Decoder, Logits, SeqStep};
use kwker_kernels::isa::{self, Isa};
use kwker_kernels::par::Serial;

const CONTEXT: usize = 200;

fn decoders(kv: KvFormat) -> (Decoder, Decoder) {
    let mut r = base(2);
    r.layer_specs[0].window = Some(3); // layer 1 stays global
    let lim = |chunk_rows| Limits {
        slots: 2,
        max_context: CONTEXT,
        chunk_rows,
        kv,
    };
    // chunk_rows 4: the windowed layer holds 2 + 64 + 8 = 74 positions. chunk_rows 100: it would hold
    // 266, so it holds the whole context (the reference). Steps here have at most 4 rows, so both read
    // them in the same windows.
    (build_with(&r, 5, lim(4)), build_with(&r, 5, lim(100)))
}

/// Feeds `tokens` to `slot` in steps of `step` tokens; the logits of every row.
fn feed(dec: &mut Decoder, isa: Isa, slot: usize, tokens: &[u32], step: usize) -> Vec<f32> {
    let v = dec.recipe().vocab;
    let mut out = Vec::new();
    for part in tokens.chunks(step) {
        let mut rows = vec![0.0; part.len() * v];
        dec.step(
            isa,
            &Serial,
            &[SeqStep {
                slot,
                tokens: part,
                logits: Logits::All,
            }],
            &mut rows,
        )
        .unwrap();
        out.extend(rows);
    }
    out
}

fn tokens(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 7 + seed) % 50).collect()
}

#[test]
fn a_window_held_alone_gives_the_whole_contexts_logits() {
    let formats = [
        (KvFormat::F32, 16 * 4),
        (KvFormat::Bf16, 16 * 2),
        (KvFormat::Q8, 16 + 4),
    ];
    for (tier, (kv, row_bytes)) in isa::supported()
        .into_iter()
        .flat_map(|t| formats.map(|f| (t, f)))
    {
        let (mut small, mut full) = decoders(kv);
        let (a, b) = (&mut small, &mut full);
        let (bytes, per_token) = a.kv_bytes();
        let per_position = 2 * 2 * row_bytes; // k and v, kv_heads 2, head_dim 16
        assert_eq!(bytes, (74 + CONTEXT) * per_position);
        assert_eq!(
            per_token, per_position,
            "only the global layer grows per token"
        );
        assert_eq!(b.kv_bytes().0, 2 * CONTEXT * per_position);

        let t = tokens(150, 3);
        for step in [1, 3, 4] {
            a.truncate(0, 0).unwrap();
            b.truncate(0, 0).unwrap();
            assert_eq!(feed(a, tier, 0, &t, step), feed(b, tier, 0, &t, step));
        }
        // The window's keys moved (150 > 74): the slot keeps its window and 64 older tokens.
        let least = a.slot_min_len(0).unwrap();
        assert!(least > 0 && least <= 150 - 64, "{least}");
        assert_eq!(b.slot_min_len(0).unwrap(), 0);

        // Back 60 tokens (past the window's edge, within KEEP), then on: the same logits.
        let more = tokens(20, 11);
        a.truncate(0, 90).unwrap();
        b.truncate(0, 90).unwrap();
        assert_eq!(feed(a, tier, 0, &more, 3), feed(b, tier, 0, &more, 3));

        // A prefix copied to the other slot (its keys from the source's base on), then continued.
        let held = a.slot_len(0).unwrap();
        a.copy_prefix(0, 1, held - 5).unwrap();
        b.copy_prefix(0, 1, held - 5).unwrap();
        assert_eq!(feed(a, tier, 1, &more, 2), feed(b, tier, 1, &more, 2));

        // Further back than the kept keys: refused, nothing changed; emptying always works.
        let least = a.slot_min_len(0).unwrap();
        let err = a.truncate(0, least - 1).unwrap_err();
        assert!(
            err.contains("sliding-window") && err.contains("Empty the slot"),
            "{err}"
        );
        let err = a.copy_prefix(0, 1, least - 1).unwrap_err();
        assert!(err.contains("sliding-window"), "{err}");
        assert_eq!(a.slot_len(0).unwrap(), held);
        a.truncate(0, 0).unwrap();
        assert_eq!(a.slot_min_len(0).unwrap(), 0);
    }
}
