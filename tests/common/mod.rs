//! Shared by the integration tests: where the golden vectors live and how to read them.
#![allow(dead_code)]

use std::path::PathBuf;

use burn_lowp::tensor_file::TensorFile;
use serde_json::Value;

/// `LOWP_TEST_DATA` (for test binaries run away from the repository) or this repository's
/// `tests/data`: the package's own, or for a package below the root (`cli/`) the root's.
pub fn data_dir() -> PathBuf {
    std::env::var_os("LOWP_TEST_DATA").map(PathBuf::from).unwrap_or_else(|| {
        let package = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        package
            .ancestors()
            .map(|dir| dir.join("tests/data"))
            .find(|dir| dir.is_dir())
            .unwrap_or_else(|| package.join("tests/data"))
    })
}

/// Burn's seed is process-wide (`Backend::seed` seeds one generator that every weight init and
/// `Tensor::random` draws from): every test of a binary that draws from it holds this lock, so
/// that a seeded run's draws come from its own seed alone, as in a single-run program.
static SEEDED: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Holds Burn's global generator for the caller (a panicked holder does not poison it).
pub fn seeded() -> std::sync::MutexGuard<'static, ()> {
    SEEDED.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn goldens_path() -> PathBuf {
    data_dir().join("goldens_public.safetensors")
}

pub struct Goldens {
    pub file: TensorFile,
    pub cases: Vec<Value>,
}

pub fn goldens() -> Goldens {
    let manifest = std::fs::read_to_string(data_dir().join("goldens_public.json"))
        .expect("tests/data/goldens_public.json is part of the repository");
    let manifest: Value = serde_json::from_str(&manifest).expect("manifest is JSON");
    Goldens {
        file: TensorFile::open(goldens_path()).expect("golden safetensors file"),
        cases: manifest["cases"].as_array().expect("cases array").clone(),
    }
}

impl Goldens {
    pub fn u8(&self, case: &Value, field: &str) -> (Vec<usize>, Vec<u8>) {
        let name = format!("{}.{field}", case["name"].as_str().unwrap());
        self.file.read_u8(&name).unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn f32(&self, case: &Value, field: &str) -> (Vec<usize>, Vec<f32>) {
        let name = format!("{}.{field}", case["name"].as_str().unwrap());
        self.file.read_f32(&name).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// The top-left `[rows, cols]` of a row-major matrix with `stride` columns, after checking that
/// every cell outside it is zero (padding).
pub fn crop_zero_padded(values: &[u8], stride: usize, rows: usize, cols: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows * cols);
    for (i, &v) in values.iter().enumerate() {
        let (r, c) = (i / stride, i % stride);
        if r < rows && c < cols {
            out.push(v);
        } else {
            assert_eq!(v, 0, "padding cell ({r}, {c}) is {v}, not 0");
        }
    }
    out
}

/// Position of an E2M1 code on the signed grid -6..6 (codes 0 and 8, +0 and -0, share one).
pub fn e2m1_grid_position(code: u8) -> i32 {
    let magnitude = (code & 7) as i32;
    if code & 8 != 0 {
        7 - magnitude
    } else {
        7 + magnitude
    }
}

/// Compares packed E2M1 bytes: returns (elements, mismatching elements), and panics if any
/// mismatch is not a neighbouring grid value.
pub fn compare_e2m1_neighbours(what: &str, ours: &[u8], golden: &[u8]) -> (usize, usize) {
    assert_eq!(ours.len(), golden.len(), "{what}: byte counts differ");
    let mut mismatches = 0;
    for (i, (&a, &b)) in ours.iter().zip(golden).enumerate() {
        for shift in [0, 4] {
            let (ca, cb) = ((a >> shift) & 0xF, (b >> shift) & 0xF);
            let (pa, pb) = (e2m1_grid_position(ca), e2m1_grid_position(cb));
            if pa != pb {
                mismatches += 1;
                assert_eq!(
                    (pa - pb).abs(),
                    1,
                    "{what}: element {} is code {ca:#x}, golden {cb:#x}: not neighbours",
                    2 * i + shift as usize / 4
                );
            }
        }
    }
    (ours.len() * 2, mismatches)
}

/// SplitMix64: a tiny deterministic generator for test inputs.
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// A `[rows, cols]` BF16-representable matrix: unit Gaussians, each row scaled by 2^e with e
/// uniform in `[-spread, spread]`, so blocks see both large and tiny values.
pub fn random_matrix(
    rows: usize,
    cols: usize,
    seed: u64,
    spread: f64,
) -> burn_lowp::format::HostMatrix {
    use burn_lowp::format::{HostMatrix, InputDtype};
    let mut rng = SplitMix(seed);
    let mut values = Vec::with_capacity(rows * cols);
    for _ in 0..rows {
        let row_scale = (2.0 * spread * rng.uniform() - spread).exp2();
        for _ in 0..cols {
            values.push(InputDtype::BF16.round((rng.normal() * row_scale) as f32));
        }
    }
    HostMatrix::new("random", rows, cols, InputDtype::BF16, values).unwrap()
}

/// Reads an f32 tensor of backend `B` back to the host.
pub fn read_f32<B: burn_lowp::backend::LowpBackend>(
    t: burn::tensor::ops::FloatTensor<B>,
) -> Vec<f32> {
    burn::tensor::read_sync(B::float_into_data(t))
        .unwrap()
        .convert::<f32>()
        .into_vec::<f32>()
        .unwrap()
}

/// Whether a backend's tests can run here. A missing runtime skips them with a message, unless
/// `require_var` (or `LOWP_TEST_DEVICE=<name>`) demands the runtime, which fails the test instead.
pub fn probe_device(name: &str, require_var: &str, available: impl FnOnce() -> bool) -> bool {
    let required = std::env::var(require_var).is_ok_and(|v| v == "1")
        || std::env::var("LOWP_TEST_DEVICE").is_ok_and(|v| v == name);
    let ok = available();
    if !ok {
        assert!(
            !required,
            "{require_var}/LOWP_TEST_DEVICE demand the {name} runtime, but none was found"
        );
        eprintln!("skipping {name} kernel tests: no {name} device on this machine");
    }
    ok
}

/// The recipe files: `LOWP_RECIPES`, else this repository's `recipes/`, else `./recipes` (the GPU
/// bundle runs from a copy of the repository root).
pub fn recipes_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("LOWP_RECIPES") {
        return PathBuf::from(dir);
    }
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("recipes");
    if here.is_dir() {
        here
    } else {
        PathBuf::from("recipes")
    }
}

/// CUDA device 0 when a CUDA GPU is there (`probe_device` rules: `LOWP_REQUIRE_CUDA=1` or
/// `LOWP_TEST_DEVICE=cuda` make its absence a failure).
#[cfg(feature = "cuda")]
pub fn cuda_device() -> Option<burn_lowp_kernels::cubecl::cuda::CudaDevice> {
    probe_device(
        "cuda",
        "LOWP_REQUIRE_CUDA",
        burn_lowp::backend::device::cuda_available,
    )
    .then(|| burn_lowp_kernels::cubecl::cuda::CudaDevice::new(0))
}

/// The first `n` little-endian u32 words of a device buffer (runtime-level kernel tests).
pub fn read_words<R: burn_lowp_kernels::cubecl::prelude::Runtime>(
    client: &burn_lowp_kernels::cubecl::prelude::ComputeClient<R>,
    handle: &burn_lowp_kernels::cubecl::server::Handle,
    n: usize,
) -> Vec<u32> {
    let bytes = client.read_one(handle.clone()).expect("device read");
    bytes[..4 * n]
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}
