//! Reading a built decoder back out, for `KwkDecoder.save` and reports: its recipe and limits as JSON,
//! the list of tensors it holds with their stored formats, each tensor's bytes exactly as stored
//! (`kwker_decoder_export`; `kwker_decoder_set_packed` takes them back), and the weight bytes a decode
//! step reads.
use crate::decoder_handle::{c_str, handle, lock, size, write_out};
use crate::error::guarded;
use kwker_kernels::decoder::tensors::{present, Tensor};
use kwker_kernels::decoder::weights::{Mat, Stored};
use serde_json::json;
use std::ffi::{c_char, c_void};

/// {"recipe": ..., "limits": {...}} of a built decoder, as JSON.
///
/// # Safety
/// `h` a live decoder; `out` null or writable for `cap` bytes; `needed` writable.
#[no_mangle]
pub unsafe extern "C" fn kwker_decoder_describe(
    h: *mut c_void,
    out: *mut u8,
    cap: usize,
    needed: *mut usize,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        // SAFETY: forwarded caller guarantees (here and below).
        let h = unsafe { handle(h)? };
        let dec = lock(h);
        let w = dec.weights();
        let tensors: Vec<_> = present(dec.recipe())
            .into_iter()
            .map(|p| {
                let format = match w.mat_at(p.tensor, p.layer, p.expert) {
                    Some(m) => m.format().name(),
                    None => "vector",
                };
                json!({"name": p.tensor.spec().name, "layer": p.layer, "expert": p.expert,
                       "rows": p.shape[0], "cols": p.shape[1], "format": format})
            })
            .collect();
        let d = json!({"recipe": dec.recipe(), "limits": dec.limits(), "tensors": tensors});
        unsafe { write_out(d.to_string().as_bytes(), out, cap, needed) }
    })
}

/// Tensor `name` of `layer` (and `expert`, for per-expert tensors) as stored: writes its format's name (NUL-terminated, into `fmt`, 16
/// bytes: "f32", "bf16", "q8", "q4", or "vector" for an f32 vector), its shape, and its bytes into
/// `buf` when not null (`needed` gets the byte count; an error if `buf_len` is too small).
///
/// # Safety
/// `h` a live decoder; `name` NUL-terminated; `fmt` writable for 16 bytes; the out-pointers valid;
/// `buf` null or holding `buf_len` bytes.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kwker_decoder_export(
    h: *mut c_void,
    name: *const c_char,
    layer: i64,
    expert: i64,
    fmt: *mut c_char,
    rows: *mut i64,
    cols: *mut i64,
    buf: *mut u8,
    buf_len: usize,
    needed: *mut usize,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    // SAFETY: forwarded caller guarantees.
    unsafe {
        export(
            h,
            name,
            layer,
            expert,
            false,
            (fmt, rows, cols),
            buf,
            buf_len,
            needed,
            err,
            err_len,
        )
    }
}

/// As `kwker_decoder_export`, but the bytes are the tensor's values as little-endian f32, row after row
/// (a quantized matrix dequantized exactly as the kernels read it): what tests and reports compare.
///
/// # Safety
/// As `kwker_decoder_export`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kwker_decoder_export_values(
    h: *mut c_void,
    name: *const c_char,
    layer: i64,
    expert: i64,
    fmt: *mut c_char,
    rows: *mut i64,
    cols: *mut i64,
    buf: *mut u8,
    buf_len: usize,
    needed: *mut usize,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    // SAFETY: forwarded caller guarantees.
    unsafe {
        export(
            h,
            name,
            layer,
            expert,
            true,
            (fmt, rows, cols),
            buf,
            buf_len,
            needed,
            err,
            err_len,
        )
    }
}

/// The two exports' one body: `values` picks f32 values over the stored bytes.
///
/// # Safety
/// As `kwker_decoder_export`.
#[allow(clippy::too_many_arguments)]
unsafe fn export(
    h: *mut c_void,
    name: *const c_char,
    layer: i64,
    expert: i64,
    values: bool,
    (fmt, rows, cols): (*mut c_char, *mut i64, *mut i64),
    buf: *mut u8,
    buf_len: usize,
    needed: *mut usize,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        // SAFETY: forwarded caller guarantees (here and below).
        let h = unsafe { handle(h)? };
        let name = unsafe { c_str(name, "the tensor name")? };
        if fmt.is_null() || rows.is_null() || cols.is_null() || needed.is_null() {
            return Err("null output pointer".into());
        }
        let t = Tensor::by_name(name).ok_or_else(|| format!("unknown tensor name {name:?}"))?;
        let (layer, expert) = (size(layer, "layer")?, size(expert, "expert")?);
        let dec = lock(h);
        let w = dec.weights();
        let missing = || format!("this decoder holds no {name} for layer {layer}, expert {expert}");
        let mat_out = |m: &Mat| -> Vec<u8> {
            if !values {
                return m.packed_bytes();
            }
            let mut row = vec![0f32; m.cols()];
            let mut out = Vec::with_capacity(m.rows() * m.cols() * 4);
            for r in 0..m.rows() {
                m.row_f32(r, &mut row);
                out.extend(row.iter().flat_map(|x| x.to_le_bytes()));
            }
            out
        };
        let (format, [r, c], bytes): (&str, [usize; 2], Vec<u8>) = if t.spec().per_expert {
            let m = w.expert_mat(t, layer, expert).ok_or_else(missing)?;
            (m.format().name(), [m.rows(), m.cols()], mat_out(m))
        } else {
            let s = w.get(t, layer).ok_or_else(missing)?;
            match s {
                Stored::Mat(m) => (m.format().name(), s.shape(), mat_out(m)),
                Stored::Vec(v) => (
                    "vector",
                    s.shape(),
                    v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                ),
            }
        };
        // SAFETY: valid out-pointers (caller's contract, null-checked above); fmt holds 16 bytes and
        // every format name is shorter.
        unsafe {
            std::ptr::copy_nonoverlapping(format.as_ptr(), fmt as *mut u8, format.len());
            *fmt.add(format.len()) = 0;
            *rows = r as i64;
            *cols = c as i64;
        }
        if !buf.is_null() && buf_len < bytes.len() {
            return Err(format!(
                "the buffer holds {buf_len} bytes, the tensor needs {}",
                bytes.len()
            ));
        }
        // SAFETY: as above; buf (when not null) holds buf_len >= bytes.len() bytes.
        unsafe { write_out(&bytes, buf, buf_len, needed) }
    })
}

/// Weight bytes the decoder reads per decode step.
///
/// # Safety
/// `h` a live decoder.
#[no_mangle]
pub unsafe extern "C" fn kwker_decoder_weight_bytes(h: *mut c_void) -> i64 {
    // SAFETY: forwarded caller guarantee.
    match unsafe { handle(h) } {
        Ok(h) => {
            let dec = lock(h);
            let k = dec.recipe().moe.map_or(0, |m| m.top_k);
            dec.weights().bytes_per_token(k) as i64
        }
        Err(_) => -1,
    }
}
