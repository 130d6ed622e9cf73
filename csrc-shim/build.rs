//! Build script: compiles the C++ registration layer (`cpp/ops.cpp`) against torch's header-only stable
//! API and links it whole into the cdylib (its static initialisers register the ops; without
//! `+whole-archive` the linker would drop them because nothing references them).
//!
//! Torch is located through `KWKER_TORCH_DIR` (set by setup.py) or by asking `python3 -c "import torch"`.
//! Only stable-ABI C symbols of libtorch are used, resolved against the libtorch_cpu that `import torch`
//! has already loaded, so no rpath is recorded.
use std::env;
use std::path::PathBuf;
use std::process::Command;

fn torch_dir() -> PathBuf {
    if let Ok(dir) = env::var("KWKER_TORCH_DIR") {
        return PathBuf::from(dir);
    }
    let python = env::var("PYTHON").unwrap_or_else(|_| "python3".to_string());
    let out = Command::new(&python)
        .args([
            "-c",
            "import os, torch; print(os.path.dirname(torch.__file__))",
        ])
        .output()
        .unwrap_or_else(|e| panic!("kwker build: cannot run {python} to locate torch: {e}"));
    if !out.status.success() {
        panic!(
            "kwker build: torch is not importable by {python}; install torch==2.13.0 first, then \
             `pip install --no-build-isolation -e .` (or set KWKER_TORCH_DIR to torch's package folder)"
        );
    }
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn main() {
    println!("cargo:rerun-if-changed=cpp/ops.cpp");
    println!("cargo:rerun-if-changed=cpp/kwker_ffi.h");
    println!("cargo:rerun-if-env-changed=KWKER_TORCH_DIR");
    let torch = torch_dir();
    let include = torch.join("include");
    assert!(
        include.join("torch/csrc/stable/library.h").exists(),
        "kwker build: {} has no torch/csrc/stable/library.h: torch >= 2.10 is required",
        include.display()
    );
    cc::Build::new()
        .cpp(true)
        .file("cpp/ops.cpp")
        // -isystem: torch's headers are not ours to warn about.
        .flag("-isystem")
        .flag(include.to_str().expect("torch include path is not UTF-8"))
        .include("cpp")
        .flag("-std=c++17")
        .flag("-fvisibility=hidden")
        // Use only stable-ABI functions present since torch 2.10, so one binary serves 2.10+.
        .define("TORCH_TARGET_VERSION", "0x020a000000000000ULL")
        .warnings(true)
        .link_lib_modifier("+whole-archive")
        .compile("kwker_ops_cpp");
    let lib = torch.join("lib");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
}
