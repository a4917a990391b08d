//! The `lowp` binary: every golden case reproduced through the command line (compact and swizzled
//! scales), and bad input answered with one clear line and a non-zero exit, never a panic.

// The library's test helpers (golden vectors, E2M1 comparisons), shared with its own suites.
#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::{Command, Output};

use burn_lowp::format::matrix::transpose;
use burn_lowp::format::swizzle::swizzle;
use burn_lowp::tensor_file::{TensorFile, TensorWriter};
use common::{compare_e2m1_neighbours, crop_zero_padded, goldens, goldens_path};
use serde_json::Value;

/// The `lowp` binary: `LOWP_BIN` where the tests run away from the build tree (copied to a GPU machine),
/// else the one cargo built.
fn lowp(args: &[&str]) -> Output {
    let bin = std::env::var("LOWP_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_lowp").to_string());
    Command::new(bin).args(args).output().expect("run lowp")
}

fn quantize(input: &Path, tensor: &str, format: &str, extra: &[&str], output: &Path) -> Output {
    let mut args = vec![
        "quantize",
        "--input",
        input.to_str().unwrap(),
        "--tensor",
        tensor,
        "--format",
        format,
        "--output",
        output.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    lowp(&args)
}

/// The CLI format name and flags for a golden case.
fn cli_format(case: &Value) -> Option<(String, Vec<&'static str>)> {
    let p = &case["params"];
    match case["kind"].as_str().unwrap() {
        "fp8_current_scaling" => Some((
            format!("fp8-{}", p["fp8"].as_str().unwrap()),
            if p["pow2_scales"].as_bool().unwrap() {
                vec!["--pow2-scales"]
            } else {
                vec![]
            },
        )),
        "mxfp8" => Some((format!("mxfp8-{}", p["fp8"].as_str().unwrap()), vec![])),
        "nvfp4" => {
            let name = if p["rht_columnwise"].as_bool().unwrap() {
                "nvfp4-rht"
            } else if p["tile"][0].as_u64() == Some(16) {
                "nvfp4-2d"
            } else {
                "nvfp4"
            };
            Some((name.to_string(), vec![]))
        }
        _ => None,
    }
}

/// The `--device` values this build can run here: ndarray always; wgpu and cuda when compiled in
/// and present (a missing runtime fails the test when LOWP_REQUIRE_WGPU=1 / LOWP_TEST_DEVICE=cuda
/// demand it).
fn devices() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut devices = vec!["ndarray"];
    #[cfg(feature = "wgpu")]
    {
        let required = std::env::var("LOWP_REQUIRE_WGPU").is_ok_and(|v| v == "1");
        if burn_lowp::backend::device::wgpu_available() {
            devices.push("wgpu");
        } else {
            assert!(!required, "LOWP_REQUIRE_WGPU=1 but no Vulkan adapter");
            eprintln!("skipping --device wgpu: no Vulkan adapter");
        }
    }
    #[cfg(feature = "cuda")]
    {
        let required = std::env::var("LOWP_TEST_DEVICE").is_ok_and(|v| v == "cuda");
        if burn_lowp::backend::device::cuda_available() {
            devices.push("cuda");
        } else {
            assert!(!required, "LOWP_TEST_DEVICE=cuda but no CUDA device");
        }
    }
    devices
}

#[test]
fn cli_reproduces_every_golden_case_compact_and_swizzled() {
    for device in devices() {
        check_goldens_through_cli(device);
    }
}

fn check_goldens_through_cli(device: &str) {
    let g = goldens();
    let dir = tempfile::tempdir().unwrap();
    let (mut checked, mut expected_runs) = (0, 0);
    for case in &g.cases {
        let Some((format, flags)) = cli_format(case) else {
            continue;
        };
        let name = case["name"].as_str().unwrap();
        let kind = case["kind"].as_str().unwrap();
        let input = case["params"]["input"].as_str().unwrap();
        let rht = case["params"]["rht_columnwise"].as_bool() == Some(true);
        let has_byte_scales = kind != "fp8_current_scaling";
        expected_runs += if has_byte_scales { 2 } else { 1 };
        for swizzled in [false, true] {
            if swizzled && !has_byte_scales {
                continue;
            }
            let out_path = dir.path().join(format!("{name}.{swizzled}.safetensors"));
            let mut extra = flags.clone();
            extra.extend(["--device", device]);
            if swizzled {
                extra.push("--swizzled-scales");
            }
            let out = quantize(&goldens_path(), input, &format, &extra, &out_path);
            assert!(
                out.status.success(),
                "{name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let ours = TensorFile::open(&out_path).unwrap();
            for (field, spec) in case["fields"].as_object().unwrap() {
                let shape: Vec<usize> = spec["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap() as usize)
                    .collect();
                let full = format!("{name}.{field}");
                if spec["dtype"] == "float32" {
                    let (_, expected) = g.file.read_f32(&full).unwrap();
                    let (_, got) = ours.read_f32(field).unwrap();
                    if rht && field == "columnwise_amax" {
                        assert!(
                            ((got[0] - expected[0]) / expected[0]).abs() <= 1.0 / 128.0,
                            "{name}: {field}"
                        );
                    } else {
                        assert_eq!(got[0].to_bits(), expected[0].to_bits(), "{name}: {field}");
                    }
                    continue;
                }
                let (_, expected) = g.file.read_u8(&full).unwrap();
                let (got_shape, got) = ours.read_u8(field).unwrap();
                let is_scale = field.ends_with("_scale");
                if rht && field.starts_with("columnwise") {
                    if is_scale && !swizzled {
                        let got = crop_zero_padded(&got, got_shape[1], shape[0], shape[1]);
                        let bad = got.iter().zip(&expected).filter(|(a, b)| a != b).count();
                        assert!(
                            bad * 100 <= got.len(),
                            "{name}: {field}: {bad} scales differ"
                        );
                    } else if !is_scale {
                        let (n, bad) = compare_e2m1_neighbours(name, &got, &expected);
                        assert!(bad * 100 <= n, "{name}: {bad} of {n} codes differ");
                    }
                    continue;
                }
                if !is_scale {
                    assert_eq!(got_shape, shape, "{name}: {field} shape");
                    assert_eq!(got, expected, "{name}: {field}");
                } else if !swizzled {
                    assert_eq!(
                        crop_zero_padded(&got, got_shape[1], shape[0], shape[1]),
                        expected,
                        "{name}: {field}"
                    );
                } else {
                    // Swizzled = swizzle(compact); MXFP8 columnwise scales [M/32, K] are swizzled
                    // as their transpose [K, M/32], the GEMM's view of them.
                    let mx_col = kind == "mxfp8" && field.starts_with("columnwise");
                    let want = if mx_col {
                        swizzle(
                            &transpose(&expected, shape[0], shape[1]),
                            shape[1],
                            shape[0],
                        )
                        .unwrap()
                    } else {
                        swizzle(&expected, shape[0], shape[1]).unwrap()
                    };
                    assert_eq!(
                        got_shape,
                        vec![want.len()],
                        "{name}: {field} swizzled shape"
                    );
                    assert_eq!(got, want, "{name}: swizzled {field}");
                }
            }
            checked += 1;
        }
    }
    println!(
        "lowp quantize --device {device} reproduced {checked} golden runs (compact and swizzled)"
    );
    assert_eq!(checked, expected_runs);
    assert!(
        checked >= 70,
        "the manifest has at least 45 quantizer cases, 25 with block scales"
    );
}

/// Runs lowp expecting failure; returns its one stderr line.
fn expect_error(args: &[&str]) -> String {
    let out = lowp(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "{args:?} should fail; stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{args:?}: expected one line, got: {stderr}");
    lines[0].to_string()
}

fn write_file(
    path: &Path,
    tensors: &[(&str, Vec<usize>, Vec<f32>)],
    extra_u8: Option<(&str, Vec<usize>, Vec<u8>)>,
) {
    let mut w = TensorWriter::default();
    for (name, shape, values) in tensors {
        w.add_f32(name, shape.clone(), values);
    }
    if let Some((name, shape, bytes)) = extra_u8 {
        w.add_u8(name, shape, bytes);
    }
    w.write(path).unwrap();
}

#[test]
fn bad_input_gives_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model.safetensors");
    let out = dir.path().join("out.safetensors");
    write_file(
        &file,
        &[
            ("w", vec![64, 48], vec![0.5; 64 * 48]),
            ("v", vec![3, 4, 32], vec![1.0; 384]),
        ],
        Some(("ids", vec![4, 32], vec![1; 128])),
    );
    let f = file.to_str().unwrap();
    let o = out.to_str().unwrap();

    let e = expect_error(&[
        "quantize", "--input", f, "--tensor", "missing", "--format", "fp8-e4m3", "--output", o,
    ]);
    assert!(
        e.contains("`missing` not found") && e.contains("ids, v, w"),
        "{e}"
    );

    let e = expect_error(&[
        "quantize", "--input", f, "--tensor", "ids", "--format", "fp8-e4m3", "--output", o,
    ]);
    assert!(
        e.contains("`ids`") && e.contains("U8") && e.contains("BF16"),
        "{e}"
    );

    let e = expect_error(&[
        "quantize",
        "--input",
        f,
        "--tensor",
        "w",
        "--format",
        "mxfp8-e4m3",
        "--output",
        o,
    ]);
    assert!(
        e.contains("`w`") && e.contains("K = 48") && e.contains("divisible by 32"),
        "{e}"
    );

    // [3, 4, 32] flattens to M = 12 rows.
    let e = expect_error(&[
        "quantize", "--input", f, "--tensor", "v", "--format", "nvfp4", "--output", o,
    ]);
    assert!(
        e.contains("`v`") && e.contains("M = 12") && e.contains("divisible by 16"),
        "{e}"
    );

    let e = expect_error(&[
        "quantize",
        "--input",
        f,
        "--tensor",
        "w",
        "--format",
        "fp8-block-1x128",
        "--output",
        o,
    ]);
    assert!(
        e.contains("K = 48") && e.contains("divisible by 128"),
        "{e}"
    );

    let e = expect_error(&[
        "quantize",
        "--input",
        "/nonexistent/x.safetensors",
        "--tensor",
        "w",
        "--format",
        "nvfp4",
        "--output",
        o,
    ]);
    assert!(
        e.contains("/nonexistent/x.safetensors") && e.contains("No such file"),
        "{e}"
    );

    let garbage = dir.path().join("garbage.safetensors");
    std::fs::write(&garbage, b"definitely not safetensors").unwrap();
    let e = expect_error(&[
        "quantize",
        "--input",
        garbage.to_str().unwrap(),
        "--tensor",
        "w",
        "--format",
        "nvfp4",
        "--output",
        o,
    ]);
    assert!(e.contains("not a safetensors file"), "{e}");

    let e = expect_error(&[
        "quantize",
        "--input",
        f,
        "--tensor",
        "w",
        "--format",
        "fp8-e4m3",
        "--swizzled-scales",
        "--output",
        o,
    ]);
    assert!(
        e.contains("--swizzled-scales") && e.contains("MXFP8 and NVFP4 only"),
        "{e}"
    );

    let e = expect_error(&[
        "quantize", "--input", f, "--tensor", "w", "--format", "nvfp4", "--seed", "3", "--output",
        o,
    ]);
    assert!(e.contains("--seed") && e.contains("nvfp4-sr only"), "{e}");

    let e = expect_error(&[
        "quantize", "--input", f, "--tensor", "w", "--format", "fp8-e9m9", "--output", o,
    ]);
    assert!(e.contains("fp8-e9m9"), "{e}");

    let e = expect_error(&[
        "quantize",
        "--input",
        f,
        "--tensor",
        "w",
        "--format",
        "fp8-e4m3",
        "--output",
        "/nonexistent/dir/out.safetensors",
    ]);
    assert!(e.contains("/nonexistent/dir/out.safetensors"), "{e}");

    let e = expect_error(&["inspect", "--input", garbage.to_str().unwrap()]);
    assert!(e.contains("not a safetensors file"), "{e}");
}

#[test]
fn any_rank_and_dtype_quantize_and_inspect_reports_every_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model.safetensors");
    let values: Vec<f32> = (0..2 * 16 * 64)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01)
        .collect();
    write_file(
        &file,
        &[
            ("layer.w", vec![2, 16, 64], values.clone()),
            ("bias", vec![64], vec![0.1; 64]),
        ],
        Some(("ids", vec![8], vec![0; 8])),
    );
    let out = dir.path().join("q.safetensors");
    let o = quantize(&file, "layer.w", "nvfp4-sr", &["--seed", "7"], &out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let q = TensorFile::open(&out).unwrap();
    assert_eq!(q.read_u8("rowwise_data").unwrap().0, vec![32, 32]);
    assert_eq!(q.read_u8("columnwise_data").unwrap().0, vec![64, 16]);
    let meta = q.metadata().unwrap();
    assert_eq!(meta["matrix_shape"], "[32, 64]");
    assert_eq!(meta["seed"], "7");

    let report = lowp(&[
        "inspect",
        "--input",
        file.to_str().unwrap(),
        "--format",
        "fp8-e4m3",
        "--format",
        "mxfp8-e4m3",
        "--format",
        "nvfp4",
    ]);
    assert!(
        report.status.success(),
        "{}",
        String::from_utf8_lossy(&report.stderr)
    );
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(
        text.contains("layer.w  shape [2, 16, 64]  dtype f32  amax 5.000000e-1"),
        "{text}"
    );
    assert!(
        text.contains("ids  shape [8]  dtype U8") && text.contains("skipped"),
        "{text}"
    );
    // The bias is one row (M = 1): MXFP8 needs M % 32, so it is reported as not applicable.
    assert!(text.contains("bias") && text.contains("n/a"), "{text}");
    let fp8_line = text
        .lines()
        .skip_while(|l| !l.starts_with("layer.w"))
        .nth(1)
        .unwrap();
    assert!(
        fp8_line.contains("fp8-e4m3") && fp8_line.contains("underflow   0.0000%"),
        "{fp8_line}"
    );
}

#[test]
fn f16_and_bf16_inputs_are_read_as_their_dtype() {
    use safetensors::{serialize, tensor::TensorView, Dtype};
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("halves.safetensors");
    // At most 6 significant bits: exact in f16 and bf16 alike.
    let values: Vec<f32> = (0..32 * 32)
        .map(|i| ((i % 64) as f32 - 32.0) / 8.0 * (1 << (i / 64 % 4)) as f32)
        .collect();
    let f16: Vec<u8> = values
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    let bf16: Vec<u8> = values
        .iter()
        .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
        .collect();
    let views = vec![
        (
            "a",
            TensorView::new(Dtype::F16, vec![32, 32], &f16).unwrap(),
        ),
        (
            "b",
            TensorView::new(Dtype::BF16, vec![32, 32], &bf16).unwrap(),
        ),
    ];
    std::fs::write(&file, serialize(views, None).unwrap()).unwrap();
    for (tensor, dtype) in [("a", "f16"), ("b", "bf16")] {
        let out = dir.path().join(format!("{tensor}.q"));
        let o = quantize(&file, tensor, "mxfp8-e4m3", &[], &out);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let q = TensorFile::open(&out).unwrap();
        assert_eq!(q.metadata().unwrap()["source_dtype"], dtype);
        // The values are exact in both dtypes: both files give the same codes.
        let expected = burn_lowp::format::quantize_mxfp8(
            &burn_lowp::format::HostMatrix::new(
                "x",
                32,
                32,
                burn_lowp::format::InputDtype::F32,
                values.clone(),
            )
            .unwrap(),
            &burn_lowp::format::Mxfp8Config {
                fp8: burn_lowp::format::Fp8Format::E4M3,
                block_2d: false,
            },
            burn_lowp::format::Usage::BOTH,
        )
        .unwrap();
        assert_eq!(
            q.read_u8("rowwise_data").unwrap().1,
            expected.rowwise.unwrap().codes
        );
    }
}
