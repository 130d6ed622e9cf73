//! The Rust half of the torch extension: C entry points (declared in `cpp/kwker_ffi.h`) that turn raw
//! pointers into slices and call `kwker_kernels`.
//!
//! Contract: every entry point returns 0 on success, or non-zero with a message in `err`. Panics are
//! caught here (`catch_unwind`) and reported as errors, so no Rust panic ever unwinds into C++.
//! bf16 activations are widened to f32 before the kernel and the f32 result is rounded to bf16 once
//! at the end, so a bf16 call equals the f32 computation on the same (bf16-valued) inputs.
// The FFI layer turns panics into errors with catch_unwind; under panic=abort a kernel bug would kill
// the user's Python process instead. Refuse to build that way.
#[cfg(panic = "abort")]
compile_error!(
    "kwker-shim must be built with panic = \"unwind\" (Cargo.toml [profile.*]): its C entry points \
     catch Rust panics and report them as Python errors, which panic = \"abort\" makes impossible"
);

mod attention_ffi;
mod config;
mod decoder_build_ffi;
mod decoder_handle;
mod decoder_io_ffi;
mod decoder_step_ffi;
mod error;
mod exec_ffi;
mod linear_ffi;
mod sample_ffi;
mod torch_pool;

pub use attention_ffi::kwker_decode_attention;
pub use config::{
    kwker_isa_name, kwker_isa_supported, kwker_num_threads, kwker_set_isa, kwker_set_num_threads,
};
pub use decoder_build_ffi::{
    kwker_decoder_abi, kwker_decoder_build, kwker_decoder_builder, kwker_decoder_builder_free,
    kwker_decoder_free, kwker_decoder_set, kwker_decoder_set_coded, kwker_decoder_set_packed,
    kwker_quant_grid, kwker_recipe_tensors,
};
pub use decoder_io_ffi::{
    kwker_decoder_describe, kwker_decoder_export, kwker_decoder_weight_bytes,
};
pub use decoder_step_ffi::{
    kwker_decoder_copy_prefix, kwker_decoder_generate, kwker_decoder_pool_stalls,
    kwker_decoder_set_position, kwker_decoder_slot_len, kwker_decoder_slot_tokens,
    kwker_decoder_step, kwker_decoder_truncate,
};
pub use exec_ffi::{kwker_plan_free, kwker_plan_new, kwker_plan_run};
pub use linear_ffi::kwker_linear;
pub use sample_ffi::{
    kwker_lookup_counts, kwker_lookup_free, kwker_lookup_new, kwker_lookup_next,
    kwker_lookup_propose, kwker_lookup_record, kwker_lookup_size, kwker_lookup_update,
    kwker_rng_seed, kwker_rng_uniform, kwker_sample, kwker_sample_distribution, kwker_sample_draw,
};
