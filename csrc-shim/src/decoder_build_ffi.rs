//! Building a decoder from C (called from `kwker_torch/decoder/native.py` through ctypes, which
//! releases the GIL for each call): `kwker_decoder_builder` (the recipe as JSON and the limits), one
//! `kwker_decoder_set` / `kwker_decoder_set_packed` per tensor, by its name in the tensor table
//! (copied in and checked), then `kwker_decoder_build`. `kwker_decoder_abi` hands Python every code
//! that crosses this boundary (tensor names, dtypes, formats, logits modes, step outputs, finish
//! reasons), so each is defined once, here and in the kernels crate.
use crate::decoder_handle::{c_str, pool, raw_slice, size, write_out, Handle};
use crate::decoder_step_ffi::{FINISH_CODES, LOGITS_CODES, OUTPUT_CODES};
use crate::error::guarded;
use kwker_kernels::decoder::builder::{Builder, Data, Store};
use kwker_kernels::decoder::recipe::{KvFormat, Limits, Recipe};
use kwker_kernels::decoder::tensors::{present, TABLE};
use kwker_kernels::decoder::weights::MatFormat;
use kwker_kernels::quant::{gguf, grid, quantize, Format, QuantOptions};
use serde_json::json;
use std::ffi::{c_char, c_void};
use std::sync::Mutex;

/// Version of this boundary; `native.py` refuses a library of another.
pub const ABI_VERSION: u32 = 10;

/// Element types a tensor can be handed over in.
const DTYPES: [&str; 2] = ["f32", "bf16"];

/// The codes of this boundary as JSON: {"version", "tensors": [{name, per_layer, per_expert, matrix, about}],
/// "dtypes", "formats", "stores", "quant": [{name, granule, bits, super_row_bytes}], "logits": {mode: code},
/// "outputs": {step output: code}, "finish": {code: reason}, "gguf": {ggml type name: id}}. "gguf" lists the GGUF
/// tensor types `kwker_decoder_set_gguf` repacks (`quant::gguf`); "quant" is the quantized formats' table (`quant::Format`): what k must be a
/// multiple of, bits per weight of whole blocks, and for the super-block formats the bytes per row of a
/// super-block of t = 0..=8 sub-blocks (null otherwise), so the Python side never copies it.
///
/// # Safety
/// `out` null or writable for `cap` bytes; `needed` writable.
#[no_mangle]
pub unsafe extern "C" fn kwker_decoder_abi(
    out: *mut u8,
    cap: usize,
    needed: *mut usize,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        let tensors: Vec<_> = TABLE
            .iter()
            .map(|s| json!({"name": s.name, "per_layer": s.per_layer, "per_expert": s.per_expert, "matrix": s.matrix, "about": s.about}))
            .collect();
        let abi = json!({
            "version": ABI_VERSION,
            "tensors": tensors,
            "dtypes": DTYPES,
            "formats": MatFormat::all().map(MatFormat::name).collect::<Vec<_>>(),
            "stores": std::iter::once("as_given").chain(Format::ALL.map(Format::name)).collect::<Vec<_>>(),
            "quant": Format::ALL.map(|f| json!({
                "name": f.name(),
                "granule": f.granule(),
                "bits": f.bits_per_weight(),
                "super_row_bytes": f.is_super().then(|| (0..=8).map(|t| f.super_row_bytes(t)).collect::<Option<Vec<_>>>()).flatten(),
            })),
            "logits": LOGITS_CODES.iter().map(|(n, c)| (n.to_string(), json!(c))).collect::<serde_json::Map<_, _>>(),
            "outputs": OUTPUT_CODES.iter().map(|(n, c)| (n.to_string(), json!(c))).collect::<serde_json::Map<_, _>>(),
            "finish": FINISH_CODES.iter().map(|(n, c)| (c.to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
            "gguf": GGUF_TYPES.iter().map(|(n, c)| (n.to_string(), json!(c))).collect::<serde_json::Map<_, _>>(),
        });
        // SAFETY: forwarded caller guarantees.
        unsafe { write_out(abi.to_string().as_bytes(), out, cap, needed) }
    })
}

fn parse_recipe(json: &str) -> Result<Recipe, String> {
    let r: Recipe =
        serde_json::from_str(json).map_err(|e| format!("the recipe is malformed: {e}"))?;
    r.check()?;
    Ok(r)
}

/// The tensors a model of this recipe has, as JSON [{name, layer, expert, rows, cols}] (model-level
/// first, then layer by layer, in table order, a sparse layer's experts last): what the caller must
/// hand over.
///
/// # Safety
/// `recipe` a NUL-terminated string; `out` null or writable for `cap` bytes; `needed` writable.
#[no_mangle]
pub unsafe extern "C" fn kwker_recipe_tensors(
    recipe: *const c_char,
    out: *mut u8,
    cap: usize,
    needed: *mut usize,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        // SAFETY: forwarded caller guarantee.
        let r = parse_recipe(unsafe { c_str(recipe, "the recipe")? })?;
        let list: Vec<_> = present(&r)
            .into_iter()
            .map(|p| {
                json!({"name": p.tensor.spec().name, "layer": p.layer, "expert": p.expert,
                            "rows": p.shape[0], "cols": p.shape[1]})
            })
            .collect();
        // SAFETY: forwarded caller guarantees.
        unsafe {
            write_out(
                serde_json::Value::from(list).to_string().as_bytes(),
                out,
                cap,
                needed,
            )
        }
    })
}

/// Starts a decoder from its recipe (JSON) and limits (`kv_cache`: "f32", "bf16" or "q8"); returns a
/// builder handle, or null with a message.
///
/// # Safety
/// `recipe` and `kv_cache` NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn kwker_decoder_builder(
    recipe: *const c_char,
    slots: i64,
    max_context: i64,
    chunk_rows: i64,
    kv_cache: *const c_char,
    err: *mut c_char,
    err_len: usize,
) -> *mut c_void {
    let mut out: *mut c_void = std::ptr::null_mut();
    guarded(err, err_len, || {
        // SAFETY: forwarded caller guarantee.
        let r = parse_recipe(unsafe { c_str(recipe, "the recipe")? })?;
        let limits = Limits {
            slots: size(slots, "max_batch")?,
            max_context: size(max_context, "max_context")?,
            chunk_rows: size(chunk_rows, "chunk_rows")?,
            // SAFETY: forwarded caller guarantee.
            kv: KvFormat::parse(unsafe { c_str(kv_cache, "the KV cache format")? })?,
        };
        let mut b = Builder::new(r, limits)?;
        // Quantization runs on as many threads as steps will (KWKER_NUM_THREADS, or torch's count).
        b.set_threads(pool().threads());
        out = Box::into_raw(Box::new(b)) as *mut c_void;
        Ok(())
    });
    out
}

/// # Safety
/// `b` must be a live builder handle, used by one thread at a time.
unsafe fn builder<'a>(b: *mut c_void) -> Result<&'a mut Builder, String> {
    if b.is_null() {
        return Err("the builder handle is null".into());
    }
    // SAFETY: a live builder (caller's contract).
    Ok(unsafe { &mut *(b as *mut Builder) })
}

/// The builder, tensor name and format name of a `set_*` call that names a stored format.
///
/// # Safety
/// `b` a live builder handle or null; `name` and `format` NUL-terminated or null.
unsafe fn named<'a>(
    b: *mut c_void,
    name: *const c_char,
    format: *const c_char,
) -> Result<(&'a mut Builder, &'a str, &'a str), String> {
    // SAFETY: the caller's guarantees, forwarded.
    unsafe {
        Ok((
            builder(b)?,
            c_str(name, "the tensor name")?,
            c_str(format, "the format")?,
        ))
    }
}

/// Copies tensor `name` of `layer` (and `expert`, for per-expert tensors) into a builder: `dtype` "f32" or "bf16", `rows * cols` elements at
/// `data`; `store` "as_given" (matrices keep their dtype, vectors become f32), "q8" or "q4"
/// (quantized; `importance`, when not null, holds `cols` f32 values: the mean square of each input
/// column over a calibration text).
///
/// # Safety
/// `b` a live builder handle; the strings NUL-terminated; `data` holds `rows * cols` elements of
/// `dtype`; `importance` null or holding `cols` f32s.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kwker_decoder_set(
    b: *mut c_void,
    name: *const c_char,
    layer: i64,
    expert: i64,
    dtype: *const c_char,
    data: *const c_void,
    rows: i64,
    cols: i64,
    store: *const c_char,
    importance: *const f32,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        // SAFETY: forwarded caller guarantees (here and below).
        let bd = unsafe { builder(b)? };
        let (name, dtype, store) = unsafe {
            (
                c_str(name, "the tensor name")?,
                c_str(dtype, "the dtype")?,
                c_str(store, "the store")?,
            )
        };
        let (rows, cols) = (size(rows, "rows")?, size(cols, "cols")?);
        let n = rows.checked_mul(cols).ok_or("the tensor size overflows")?;
        if data.is_null() && n > 0 {
            return Err(format!("{name}: the tensor data is null"));
        }
        // SAFETY: data holds rows * cols elements of dtype (caller's contract).
        let d = unsafe {
            match dtype {
                "f32" => Data::F32(raw_slice(data as *const f32, n)),
                "bf16" => Data::Bf16(raw_slice(data as *const u16, n)),
                _ => {
                    return Err(format!(
                        "unknown dtype {dtype:?}; expected one of {DTYPES:?}"
                    ))
                }
            }
        };
        // SAFETY: importance, when not null, holds cols f32s (caller's contract).
        let imp = (!importance.is_null()).then(|| unsafe { raw_slice(importance, cols) });
        let store = match store {
            "as_given" => Store::AsGiven,
            q => match Format::from_name(q) {
                Some(f) => Store::Quant(f, imp),
                None => {
                    return Err(format!(
                        "unknown store {store:?}; expected as_given or one of {:?}",
                        Format::ALL.map(Format::name)
                    ))
                }
            },
        };
        let (layer, expert) = (size(layer, "layer")?, size(expert, "expert")?);
        bd.set(name, layer, expert, d, rows, cols, store)
    })
}

/// Copies matrix `name` in as GPTQ leaves it (`Store::Coded`): `format`'s scales fitted to `fit`
/// (`rows * cols` f32, with `importance` as `kwker_decoder_set` takes it), then `codes` (`rows * cols`
/// bytes, stored form, `kwker_quant_grid`'s) under them.
///
/// # Safety
/// `b` a live builder handle; the strings NUL-terminated; `fit` holds `rows * cols` f32s and `codes`
/// as many bytes; `importance` null or holding `cols` f32s.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kwker_decoder_set_coded(
    b: *mut c_void,
    name: *const c_char,
    layer: i64,
    expert: i64,
    format: *const c_char,
    fit: *const f32,
    codes: *const u8,
    rows: i64,
    cols: i64,
    importance: *const f32,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        // SAFETY: forwarded caller guarantees (here and below).
        let (bd, name, format) = unsafe { named(b, name, format)? };
        let f = quant_format(format)?;
        let (rows, cols) = (size(rows, "rows")?, size(cols, "cols")?);
        let n = rows.checked_mul(cols).ok_or("the tensor size overflows")?;
        if (fit.is_null() || codes.is_null()) && n > 0 {
            return Err(format!("{name}: the values or codes are null"));
        }
        // SAFETY: fit and codes hold n elements, importance null or cols (caller's contract).
        let (fit, codes) = unsafe { (raw_slice(fit, n), raw_slice(codes, n)) };
        let imp = (!importance.is_null()).then(|| unsafe { raw_slice(importance, cols) });
        let (layer, expert) = (size(layer, "layer")?, size(expert, "expert")?);
        bd.set(
            name,
            layer,
            expert,
            Data::F32(fit),
            rows,
            cols,
            Store::Coded(f, imp, codes),
        )
    })
}

/// Fits `format` to a `rows x cols` f32 matrix (with `importance`, null or `cols` f32s) and writes its
/// codes (`rows * cols` bytes, stored form), each 32-value sub-block's step and offset (`rows * cols / 32`
/// f32 each: code c stands for `step * c + offset`) and the codes' range (2 bytes): what GPTQ quantizes
/// a block of columns under (`quant::grid`).
///
/// # Safety
/// The strings NUL-terminated; `data` holds `rows * cols` f32s; `importance` null or `cols` f32s;
/// `codes` writable for `rows * cols` bytes, `step` and `offset` for `rows * cols / 32` f32s, `range`
/// for 2 bytes.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kwker_quant_grid(
    format: *const c_char,
    data: *const f32,
    rows: i64,
    cols: i64,
    importance: *const f32,
    codes: *mut u8,
    step: *mut f32,
    offset: *mut f32,
    range: *mut u8,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        // SAFETY: forwarded caller guarantees (here and below).
        let f = quant_format(unsafe { c_str(format, "the format")? })?;
        let (rows, cols) = (size(rows, "rows")?, size(cols, "cols")?);
        let n = rows.checked_mul(cols).ok_or("the matrix size overflows")?;
        if [
            data as usize,
            codes as usize,
            step as usize,
            offset as usize,
            range as usize,
        ]
        .contains(&0)
        {
            return Err("a null pointer was passed".into());
        }
        // SAFETY: sizes as the caller's contract states.
        let w = unsafe { raw_slice(data, n) };
        let imp = (!importance.is_null()).then(|| unsafe { raw_slice(importance, cols) });
        let opt = QuantOptions {
            format: f,
            importance: imp,
            threads: pool().threads(),
        };
        let q = quantize(w, rows, cols, &opt)?;
        let (st, off) = grid::grid(&q)?;
        let (lo, hi) = grid::code_range(f);
        // SAFETY: the outputs are writable for these lengths (caller's contract); st and off hold
        // rows * cols / 32 values (cols is a multiple of the granule, itself of 32).
        unsafe {
            std::ptr::copy_nonoverlapping(q.codes.as_ptr(), codes, n);
            std::ptr::copy_nonoverlapping(st.as_ptr(), step, st.len());
            std::ptr::copy_nonoverlapping(off.as_ptr(), offset, off.len());
            *range = lo;
            *range.add(1) = hi;
        }
        Ok(())
    })
}

fn quant_format(name: &str) -> Result<Format, String> {
    Format::from_name(name).ok_or_else(|| {
        format!(
            "unknown quantized format {name:?}; expected one of {:?}",
            Format::ALL.map(Format::name)
        )
    })
}

/// Copies one saved packed matrix (its format's name as `kwker_decoder_export` reported it) into a
/// builder.
///
/// # Safety
/// `b` a live builder handle; the strings NUL-terminated; `data` holds `len` bytes.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kwker_decoder_set_packed(
    b: *mut c_void,
    name: *const c_char,
    layer: i64,
    expert: i64,
    format: *const c_char,
    data: *const u8,
    len: usize,
    rows: i64,
    cols: i64,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        // SAFETY: forwarded caller guarantees (here and below).
        let (bd, name, format) = unsafe { named(b, name, format)? };
        let f = MatFormat::from_name(format)
            .ok_or_else(|| format!("unknown matrix format {format:?}"))?;
        // SAFETY: data holds len bytes (caller's contract); null only when len is 0.
        let bytes = unsafe { raw_slice(data, len) };
        let (rows, cols) = (size(rows, "rows")?, size(cols, "cols")?);
        let (layer, expert) = (size(layer, "layer")?, size(expert, "expert")?);
        bd.set_packed(name, layer, expert, f, rows, cols, bytes)
    })
}

/// The GGUF tensor types `kwker_decoder_set_gguf` repacks, by ggml's names.
const GGUF_TYPES: [(&str, u32); 6] = [
    ("Q4_0", gguf::Q4_0),
    ("Q4_1", gguf::Q4_1),
    ("Q5_0", gguf::Q5_0),
    ("Q8_0", gguf::Q8_0),
    ("Q4_K", gguf::Q4_K),
    ("Q6_K", gguf::Q6_K),
];

/// A matrix from a GGUF file's quantized blocks (`Builder::set_gguf`): `nparts` parts of ggml type
/// `types[i]` and `rows[i]` rows, their bytes one after another in `data`. Writes the stored format's name
/// into `format` (64 bytes; runs of rows in their own formats: the names joined by `+`) and 1 into `exact`
/// when every value is the file's.
///
/// # Safety
/// `b` a live builder; `name` NUL-terminated; `types` and `rows` hold `nparts` values; `data` holds
/// `len` bytes (null only when 0); `format` writable for 64 bytes, `exact` for one i32.
#[no_mangle]
pub unsafe extern "C" fn kwker_decoder_set_gguf(
    b: *mut c_void,
    name: *const c_char,
    layer: i64,
    expert: i64,
    types: *const u32,
    rows: *const i64,
    nparts: usize,
    data: *const u8,
    len: usize,
    cols: i64,
    format: *mut c_char,
    exact: *mut i32,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        // SAFETY: forwarded caller guarantees (here and below).
        let bd = unsafe { builder(b)? };
        let name = unsafe { c_str(name, "the tensor name")? };
        if nparts == 0 || types.is_null() || rows.is_null() || format.is_null() || exact.is_null() {
            return Err("set_gguf needs at least one part and non-null out-pointers".into());
        }
        // SAFETY: types and rows hold nparts values (caller's contract, non-null checked above).
        let (tys, ns) = unsafe {
            (
                std::slice::from_raw_parts(types, nparts),
                std::slice::from_raw_parts(rows, nparts),
            )
        };
        let parts = tys
            .iter()
            .zip(ns)
            .map(|(&t, &n)| Ok((t, size(n, "rows")?)))
            .collect::<Result<Vec<_>, String>>()?;
        // SAFETY: data holds len bytes (caller's contract); null only when len is 0.
        let bytes = unsafe { raw_slice(data, len) };
        let (layer, expert) = (size(layer, "layer")?, size(expert, "expert")?);
        let (f, ex) = bd.set_gguf(name, layer, expert, &parts, size(cols, "cols")?, bytes)?;
        let fname = f.as_bytes();
        if fname.len() >= 64 {
            return Err(format!(
                "{name}: {} runs of formats are too many to name",
                parts.len()
            ));
        }
        // SAFETY: format is writable for 64 bytes and the name is shorter (checked); exact is writable.
        unsafe {
            std::ptr::copy_nonoverlapping(fname.as_ptr(), format as *mut u8, fname.len());
            *format.add(fname.len()) = 0;
            *exact = i32::from(ex);
        }
        Ok(())
    })
}

/// Builds the decoder, consuming (and freeing) the builder either way; null with a message on error.
///
/// # Safety
/// `b` must be a live builder handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn kwker_decoder_build(
    b: *mut c_void,
    err: *mut c_char,
    err_len: usize,
) -> *mut c_void {
    let mut out: *mut c_void = std::ptr::null_mut();
    guarded(err, err_len, || {
        if b.is_null() {
            return Err("the builder handle is null".into());
        }
        // SAFETY: ownership returns from Box::into_raw in kwker_decoder_builder.
        let builder = unsafe { Box::from_raw(b as *mut Builder) };
        let dec = builder.build()?;
        out = Box::into_raw(Box::new(Handle {
            dec: Mutex::new(dec),
        })) as *mut c_void;
        Ok(())
    });
    out
}

/// Frees an unbuilt builder (null is ignored).
///
/// # Safety
/// `b` must be a builder handle not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn kwker_decoder_builder_free(b: *mut c_void) {
    if !b.is_null() {
        // SAFETY: ownership returns from Box::into_raw.
        drop(unsafe { Box::from_raw(b as *mut Builder) });
    }
}

/// Frees a decoder (null is ignored).
///
/// # Safety
/// `h` must be a decoder handle not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn kwker_decoder_free(h: *mut c_void) {
    if !h.is_null() {
        // SAFETY: ownership returns from Box::into_raw in kwker_decoder_build.
        drop(unsafe { Box::from_raw(h as *mut Handle) });
    }
}
