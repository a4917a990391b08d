//! Every golden case in `tests/data` (made by TE's and torchao's reference quantizers), bit for bit.
//! The RHT columnwise copy is the one documented tolerance: the transform's sums run in a different
//! order here than in TE's BF16 matmul, so at least 99% of its codes must match and every mismatch
//! must be a neighbouring E2M1 value.

use burn_lowp::format::{
    quantize_fp8_current, quantize_mxfp8, quantize_nvfp4, swizzle, Fp8CurrentScaling, Fp8Format,
    Mxfp8Config, Nvfp4Config, Scales, Usage,
};
use serde_json::Value;

use crate::common::{compare_e2m1_neighbours, crop_zero_padded, goldens, Goldens};

fn fp8_format(case: &Value) -> Fp8Format {
    match case["params"]["fp8"].as_str().unwrap() {
        "e4m3" => Fp8Format::E4M3,
        "e5m2" => Fp8Format::E5M2,
        other => panic!("unknown fp8 {other}"),
    }
}

fn scale_bytes(scales: &Scales) -> (&[usize; 2], &[u8]) {
    match scales {
        Scales::BlockBytes { shape, bytes, .. } => (shape, bytes),
        other => panic!("expected byte scales, got {other:?}"),
    }
}

/// Checks one case; returns the RHT (elements, mismatches) if it had an RHT copy.
fn check_case(g: &Goldens, case: &Value) -> Option<(usize, usize)> {
    let name = case["name"].as_str().unwrap();
    let kind = case["kind"].as_str().unwrap();
    let params = &case["params"];
    if kind == "scale_swizzle" {
        let (shape, compact) = g.u8(case, "compact");
        let (_, expected) = g.u8(case, "swizzled");
        let ours = swizzle::swizzle(&compact, shape[0], shape[1]).unwrap();
        assert_eq!(ours, expected, "{name}: swizzled bytes");
        let back = swizzle::unswizzle(&ours, shape[0], shape[1]).unwrap();
        let padded_cols = swizzle::swizzled_shape(shape[0], shape[1])[1];
        assert_eq!(
            crop_zero_padded(&back, padded_cols, shape[0], shape[1]),
            compact,
            "{name}: unswizzle"
        );
        return None;
    }
    let x = g
        .file
        .read_matrix(params["input"].as_str().unwrap())
        .unwrap();
    match kind {
        "fp8_current_scaling" => {
            let config = Fp8CurrentScaling {
                pow2_scales: params["pow2_scales"].as_bool().unwrap(),
                ..Fp8CurrentScaling::new(fp8_format(case))
            };
            let q = quantize_fp8_current(&x, &config, Usage::BOTH).unwrap();
            let (row, col) = (q.rowwise.unwrap(), q.columnwise.unwrap());
            assert_eq!(
                row.codes,
                g.u8(case, "rowwise_data").1,
                "{name}: rowwise_data"
            );
            assert_eq!(
                col.codes,
                g.u8(case, "columnwise_data").1,
                "{name}: columnwise_data"
            );
            let Scales::TensorScaleInv(scale_inv) = row.scales else {
                panic!()
            };
            assert_eq!(
                scale_inv.to_bits(),
                g.f32(case, "scale_inv").1[0].to_bits(),
                "{name}: scale_inv"
            );
            None
        }
        "mxfp8" => {
            let config = Mxfp8Config {
                fp8: fp8_format(case),
                block_2d: false,
            };
            let q = quantize_mxfp8(&x, &config, Usage::BOTH).unwrap();
            for (dir, data) in [
                ("rowwise", q.rowwise.unwrap()),
                ("columnwise", q.columnwise.unwrap()),
            ] {
                assert_eq!(
                    data.codes,
                    g.u8(case, &format!("{dir}_data")).1,
                    "{name}: {dir}_data"
                );
                let (gshape, gscale) = g.u8(case, &format!("{dir}_scale"));
                let (shape, bytes) = scale_bytes(&data.scales);
                assert_eq!(
                    crop_zero_padded(bytes, shape[1], gshape[0], gshape[1]),
                    gscale,
                    "{name}: {dir}_scale"
                );
            }
            None
        }
        "nvfp4" => {
            let tile = params["tile"].as_array().unwrap();
            let rht = params["rht_columnwise"].as_bool().unwrap();
            let config = Nvfp4Config {
                block_2d: tile[0].as_u64() == Some(16),
                rht,
                stochastic_seed: None,
            };
            let q = quantize_nvfp4(&x, &config, Usage::BOTH).unwrap();
            let mut rht_stats = None;
            for (dir, data) in [
                ("rowwise", q.rowwise.unwrap()),
                ("columnwise", q.columnwise.unwrap()),
            ] {
                let golden_codes = g.u8(case, &format!("{dir}_data")).1;
                let (gshape, gscale) = g.u8(case, &format!("{dir}_scale"));
                let (shape, bytes) = scale_bytes(&data.scales);
                let scales = crop_zero_padded(bytes, shape[1], gshape[0], gshape[1]);
                let golden_amax = g.f32(case, &format!("{dir}_amax")).1[0];
                if rht && dir == "columnwise" {
                    let (n, bad) = compare_e2m1_neighbours(name, &data.codes, &golden_codes);
                    assert!(
                        bad * 100 <= n,
                        "{name}: {bad} of {n} RHT codes differ (over 1%)"
                    );
                    let bad_scales = scales.iter().zip(&gscale).filter(|(a, b)| a != b).count();
                    assert!(
                        bad_scales * 100 <= scales.len(),
                        "{name}: {bad_scales} RHT scales differ"
                    );
                    let rel = ((data.amax.unwrap() - golden_amax) / golden_amax).abs();
                    assert!(
                        rel <= 1.0 / 128.0,
                        "{name}: RHT amax {:?} vs {golden_amax}",
                        data.amax
                    );
                    rht_stats = Some((n, bad));
                } else {
                    assert_eq!(data.codes, golden_codes, "{name}: {dir}_data");
                    assert_eq!(scales, gscale, "{name}: {dir}_scale");
                    assert_eq!(
                        data.amax.map(f32::to_bits),
                        Some(golden_amax.to_bits()),
                        "{name}: {dir}_amax"
                    );
                }
            }
            rht_stats
        }
        other => panic!("{name}: unknown kind {other}"),
    }
}

#[test]
fn every_golden_case_is_bit_exact() {
    let g = goldens();
    let (mut exact, mut rht_elements, mut rht_mismatches) = (0, 0, 0);
    for case in &g.cases {
        match check_case(&g, case) {
            Some((n, bad)) => {
                rht_elements += n;
                rht_mismatches += bad;
            }
            None => exact += 1,
        }
    }
    let rht_cases = g.cases.len() - exact;
    println!(
        "golden cases: {} checked, {exact} bit-exact in every field, {rht_cases} NVFP4-RHT cases \
         bit-exact rowwise with {rht_mismatches} of {rht_elements} columnwise codes off by one grid step",
        g.cases.len()
    );
    assert!(
        g.cases.len() >= 49,
        "the manifest lists {} cases",
        g.cases.len()
    );
}
