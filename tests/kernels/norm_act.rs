//! LayerNormMLP's norm and activation passes (`LowpBackend::lowp_norm_*`, `lowp_activation_*`)
//! on every backend: against f64 references of TE's formulas (within the dtype's rounding plus f32
//! arithmetic and the runtime's exp/tanh), their fused amax exactly equal to the host's
//! `max |y|` of what they stored, and the FP8 current-scaling quantize fed that amax bit-equal
//! to the unfused quantize (its own amax pass) of the same tensor.
#![allow(dead_code)]

use burn::tensor::ops::FloatTensor;
use burn_lowp::backend::{AmaxHistoryColumns, LowpBackend, NormSpec, ScaleColumns};
use burn_lowp::format::{Fp8CurrentScaling, Fp8Format, FormatConfig, HostMatrix, InputDtype, Usage};
use burn_lowp::ops::{Activation, ActivationParams, ActivationSpec};

use crate::common::{read_f32, SplitMix};
use crate::suite::assert_bit_equal;

fn matrix(rows: usize, cols: usize, dtype: InputDtype, mean: f64, std: f64, seed: u64) -> HostMatrix {
    let mut rng = SplitMix(seed);
    let values = (0..rows * cols)
        .map(|_| dtype.round((mean + std * rng.normal()) as f32))
        .collect();
    HostMatrix::new("input", rows, cols, dtype, values).unwrap()
}

/// Relative rounding bound of a store in `dtype` (one unit in the last place).
fn ulp(dtype: InputDtype) -> f64 {
    match dtype {
        InputDtype::F32 => 2f64.powi(-22),
        InputDtype::F16 => 2f64.powi(-10),
        InputDtype::BF16 => 2f64.powi(-7),
    }
}

/// `|got - want| <= ulp · |want| + atol · max |want|` everywhere.
fn assert_close(got: &[f32], want: &[f64], dtype: InputDtype, atol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-30);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (*g as f64 - w).abs();
        assert!(
            err <= ulp(dtype) * w.abs() + atol * scale,
            "{what}[{i}]: {g} vs {w} (err {err:.3e}, scale {scale:.3e})"
        );
    }
}

fn host_amax(values: &[f32]) -> f32 {
    values.iter().fold(0.0f32, |m, v| if v.abs() > m { v.abs() } else { m })
}

fn upload<B: LowpBackend>(m: &HostMatrix, device: &B::Device) -> FloatTensor<B> {
    B::bytes_float_from_host(m, device)
}

fn vector<B: LowpBackend>(values: Vec<f32>, dtype: InputDtype, device: &B::Device) -> FloatTensor<B> {
    let m = HostMatrix::new("param", 1, values.len(), dtype, values).unwrap();
    let t = B::bytes_float_from_host(&m, device);
    B::float_reshape(t, burn::tensor::Shape::new([m.cols]))
}

/// The fused amax (where the backend fuses it) equals the host's, and quantizing with it equals
/// the plain current-scaling quantize bit for bit.
fn check_amax_twin<B: LowpBackend>(
    y: FloatTensor<B>,
    amax: Option<B::Bytes>,
    stored: &[f32],
    context: &str,
) -> bool {
    let Some(amax) = amax else { return false };
    check_fused_amax::<B>(&amax, stored, context);
    let config = FormatConfig::Fp8Current(Fp8CurrentScaling::new(Fp8Format::E4M3));
    let usage = Usage {
        rowwise: true,
        columnwise: true,
    };
    let twin = B::quantize_tensor(y.clone(), &config, usage, false).unwrap();
    let fused_q = B::quantize_fp8_current_with_amax(y, &config, &amax, usage).unwrap();
    assert_bit_equal(
        &fused_q.to_host().unwrap(),
        &twin.to_host().unwrap(),
        &format!("{context}: quantize with the fused amax"),
    );
    true
}

/// The fused amax equals the host's `max |x|` of what was stored.
fn check_fused_amax<B: LowpBackend>(amax: &B::Bytes, stored: &[f32], context: &str) {
    let bits = B::bytes_to_host(amax);
    let fused = f32::from_le_bytes([bits[0], bits[1], bits[2], bits[3]]);
    assert_eq!(fused.to_bits(), host_amax(stored).to_bits(), "{context}: fused amax");
}

/// Shapes: a row shorter than one cube, and rows longer than one cube's pairs (3 cubes across,
/// a partial row block); both multiples of 16 for the FP8 twin.
const SHAPES: [(usize, usize); 2] = [(96, 160), (144, 1056)];
/// The norm kernels' shapes: `SHAPES`, widths whose chunks are 4 or 2 halves (12, 6: the
/// kernels' narrower vectors) and a row that gives each unit three chunks, the last one for only
/// part of the units (4104 halves: 513 chunks of 8 over 256 units).
const NORM_SHAPES: [(usize, usize); 5] = [(96, 160), (144, 1056), (37, 6), (70, 12), (40, 4104)];
/// The activation kernels' shapes: `SHAPES` (16-byte chunks of 8 halves or 4 f32), and widths
/// that take narrower chunks (12: 4 halves; 6: 2 halves, or 2 f32), with row counts that end
/// inside a 64-row block and inside a step of rows.
const ACTIVATION_SHAPES: [(usize, usize); 4] = [(96, 160), (144, 1056), (37, 6), (70, 12)];

pub fn check_norm_forward<B: LowpBackend>(device: &B::Device, dtypes: &[InputDtype]) {
    let mut fused = 0;
    for &dtype in dtypes {
        for (rows, cols) in NORM_SHAPES {
            for (rms, zero_centered, with_beta) in
                [(false, false, true), (true, false, false), (false, true, false), (true, true, false)]
            {
                let seed = (rows * cols) as u64 + rms as u64 * 7 + zero_centered as u64 * 13;
                let x = matrix(rows, cols, dtype, 0.7, 2.5, seed);
                let gamma = matrix(1, cols, dtype, if zero_centered { 0.0 } else { 1.0 }, 0.3, seed + 1);
                let beta = matrix(1, cols, dtype, 0.0, 0.5, seed + 2);
                let spec = NormSpec {
                    rms,
                    eps: 1e-5,
                    zero_centered_gamma: zero_centered,
                };
                let out = B::norm_forward(
                    upload::<B>(&x, device),
                    vector::<B>(gamma.values.clone(), dtype, device),
                    with_beta.then(|| vector::<B>(beta.values.clone(), dtype, device)),
                    &spec,
                    true,
                )
                .unwrap();
                let context = format!("norm rms={rms} zc={zero_centered} {} [{rows}, {cols}]", dtype.name());
                let y = read_f32::<B>(out.y.clone());
                let mean = read_f32::<B>(out.mean);
                let rstd = read_f32::<B>(out.rstd);
                let mut want = Vec::with_capacity(rows * cols);
                for r in 0..rows {
                    let row: Vec<f64> = x.values[r * cols..(r + 1) * cols].iter().map(|&v| v as f64).collect();
                    let m = if rms { 0.0 } else { row.iter().sum::<f64>() / cols as f64 };
                    let var = row.iter().map(|v| (v - m).powi(2)).sum::<f64>() / cols as f64;
                    let rs = 1.0 / (var + 1e-5).sqrt();
                    assert!((mean[r] as f64 - m).abs() <= 1e-5 * (1.0 + m.abs()), "{context}: mean[{r}]");
                    assert!((rstd[r] as f64 - rs).abs() <= 1e-5 * rs, "{context}: rstd[{r}]");
                    for c in 0..cols {
                        let g = gamma.values[c] as f64 + if zero_centered { 1.0 } else { 0.0 };
                        let b = if with_beta { beta.values[c] as f64 } else { 0.0 };
                        want.push((row[c] - m) * rs * g + b);
                    }
                }
                assert_close(&y, &want, dtype, 1e-5, &context);
                if rows % 16 == 0 && cols % 16 == 0 {
                    fused += check_amax_twin::<B>(out.y, out.amax, &y, &context) as usize;
                } else if let Some(amax) = &out.amax {
                    // Too small to block for the FP8 twin: the amax alone against the host's.
                    check_fused_amax::<B>(amax, &y, &context);
                }
            }
        }
    }
    println!("norm forward within bounds; {fused} fused amaxes and quantizes bit-exact");
}

pub fn check_norm_backward<B: LowpBackend>(device: &B::Device, dtypes: &[InputDtype]) {
    for &dtype in dtypes {
        for (rows, cols) in NORM_SHAPES {
            for (rms, zero_centered) in [(false, false), (true, true)] {
                let seed = 31 + (rows + cols) as u64 + rms as u64;
                let x = matrix(rows, cols, dtype, -0.4, 1.5, seed);
                let dy = matrix(rows, cols, dtype, 0.0, 1.0, seed + 1);
                let gamma = matrix(1, cols, dtype, if zero_centered { 0.0 } else { 1.0 }, 0.3, seed + 2);
                let spec = NormSpec {
                    rms,
                    eps: 1e-5,
                    zero_centered_gamma: zero_centered,
                };
                let g = vector::<B>(gamma.values.clone(), dtype, device);
                let fwd = B::norm_forward(upload::<B>(&x, device), g.clone(), None, &spec, false).unwrap();
                let out = B::norm_backward(
                    upload::<B>(&dy, device),
                    upload::<B>(&x, device),
                    g,
                    fwd.mean,
                    fwd.rstd,
                    &spec,
                    !rms,
                )
                .unwrap();
                let context = format!("norm backward rms={rms} {} [{rows}, {cols}]", dtype.name());
                let (mut dx, mut dgamma, mut dbeta) = (Vec::new(), vec![0.0f64; cols], vec![0.0f64; cols]);
                for r in 0..rows {
                    let row: Vec<f64> = x.values[r * cols..(r + 1) * cols].iter().map(|&v| v as f64).collect();
                    let d: Vec<f64> = dy.values[r * cols..(r + 1) * cols].iter().map(|&v| v as f64).collect();
                    let m = if rms { 0.0 } else { row.iter().sum::<f64>() / cols as f64 };
                    let var = row.iter().map(|v| (v - m).powi(2)).sum::<f64>() / cols as f64;
                    let rs = 1.0 / (var + 1e-5).sqrt();
                    let xhat: Vec<f64> = row.iter().map(|v| (v - m) * rs).collect();
                    let gy: Vec<f64> = (0..cols)
                        .map(|c| d[c] * (gamma.values[c] as f64 + if zero_centered { 1.0 } else { 0.0 }))
                        .collect();
                    let c1 = (0..cols).map(|c| gy[c] * xhat[c]).sum::<f64>() / cols as f64;
                    let c2 = if rms { 0.0 } else { gy.iter().sum::<f64>() / cols as f64 };
                    for c in 0..cols {
                        dx.push((gy[c] - xhat[c] * c1 - c2) * rs);
                        dgamma[c] += d[c] * xhat[c];
                        dbeta[c] += d[c];
                    }
                }
                assert_close(&read_f32::<B>(out.dx), &dx, dtype, 1e-4, &format!("{context}: dx"));
                assert_close(&read_f32::<B>(out.dgamma), &dgamma, InputDtype::F32, 1e-4, &format!("{context}: dgamma"));
                match out.dbeta {
                    Some(db) => assert_close(&read_f32::<B>(db), &dbeta, InputDtype::F32, 1e-4, &format!("{context}: dbeta")),
                    None => assert!(rms, "{context}: LayerNorm with β returns dβ"),
                }
            }
        }
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// TE's formulas (spec section 10) in f64: `act(x)` and `act'(x)` of the (first-half) function.
fn act_f64(act: Activation, p: &ActivationParams, x: f64) -> (f64, f64) {
    let alpha = p.alpha as f64;
    let limit = p.limit as f64;
    match act {
        Activation::Gelu | Activation::Geglu => {
            let k = 0.7978845608028654;
            let t = (k * (x + 0.044715 * x.powi(3))).tanh();
            (0.5 * x * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x))
        }
        Activation::Qgelu | Activation::Qgeglu => {
            let s = sigmoid(1.702 * x);
            (x * s, s + 1.702 * x * s * (1.0 - s))
        }
        Activation::Silu | Activation::Swiglu => {
            let s = sigmoid(x);
            (x * s, s + x * s * (1.0 - s))
        }
        Activation::Relu | Activation::Reglu => (x.max(0.0), if x > 0.0 { 1.0 } else { 0.0 }),
        Activation::Srelu | Activation::Sreglu => {
            if x > 0.0 {
                (x * x, 2.0 * x)
            } else {
                (0.0, 0.0)
            }
        }
        Activation::Glu => {
            let s = sigmoid(x);
            (s, s * (1.0 - s))
        }
        Activation::ClampedSwiglu => {
            let c = x.min(limit);
            let s = sigmoid(alpha * c);
            (c * s, if x <= limit { s + alpha * c * s * (1.0 - s) } else { 0.0 })
        }
    }
}

/// The gate factor and its derivative.
fn gate_f64(act: Activation, p: &ActivationParams, g: f64) -> (f64, f64) {
    if act == Activation::ClampedSwiglu {
        let limit = p.limit as f64;
        (
            g.clamp(-limit, limit) + p.glu_linear_offset as f64,
            if g.abs() <= limit { 1.0 } else { 0.0 },
        )
    } else {
        (g, 1.0)
    }
}

pub fn check_activations<B: LowpBackend>(device: &B::Device, dtypes: &[InputDtype]) {
    let params = ActivationParams {
        limit: 3.0,
        ..Default::default()
    };
    let mut fused = 0;
    for &dtype in dtypes {
        for act in Activation::ALL {
            for (rows, f) in ACTIVATION_SHAPES {
                let spec = ActivationSpec { activation: act, params };
                let width = if act.is_gated() { 2 * f } else { f };
                let seed = 101 + (rows * f) as u64 + act as u64;
                let h = matrix(rows, width, dtype, 0.0, 2.5, seed);
                let dy = matrix(rows, f, dtype, 0.0, 1.0, seed + 1);
                let context = format!("{act} {} [{rows}, {width}]", dtype.name());
                let fwd = B::act_forward(upload::<B>(&h, device), &spec, true).unwrap();
                let y = read_f32::<B>(fwd.y.clone());
                let bwd = B::act_backward(
                    upload::<B>(&dy, device),
                    upload::<B>(&h, device),
                    &spec,
                    true,
                    true,
                )
                .unwrap();
                let dh = read_f32::<B>(bwd.y.clone());
                let (mut want_y, mut want_dh) = (Vec::new(), vec![0.0f64; rows * width]);
                for r in 0..rows {
                    for c in 0..f {
                        let x = h.values[r * width + c] as f64;
                        let d = dy.values[r * f + c] as f64;
                        let (a, da) = act_f64(act, &params, x);
                        if act.is_gated() {
                            let (g, dg) = gate_f64(act, &params, h.values[r * width + f + c] as f64);
                            want_y.push(a * g);
                            want_dh[r * width + c] = d * g * da;
                            want_dh[r * width + f + c] = d * a * dg;
                        } else {
                            want_y.push(a);
                            want_dh[r * width + c] = d * da;
                        }
                    }
                }
                // exp and tanh in f32 (a few ulps on lavapipe) and TE's rounded constants.
                assert_close(&y, &want_y, dtype, 2e-5, &format!("{context}: forward"));
                assert_close(&dh, &want_dh, dtype, 2e-5, &format!("{context}: backward"));
                // dbias sums the stored dh (f32, another order than this host sum).
                let dbias = read_f32::<B>(bwd.dbias.expect("dbias asked for"));
                let want_db: Vec<f64> = (0..width)
                    .map(|c| (0..rows).map(|r| dh[r * width + c] as f64).sum())
                    .collect();
                assert_close(&dbias, &want_db, InputDtype::F32, 1e-5, &format!("{context}: dbias"));
                if rows % 16 == 0 && f % 16 == 0 {
                    fused += check_amax_twin::<B>(fwd.y, fwd.amax, &y, &format!("{context}: forward")) as usize;
                    fused += check_amax_twin::<B>(bwd.y, bwd.amax, &dh, &format!("{context}: backward")) as usize;
                } else {
                    // Shapes FP8 cannot block: the amaxes alone.
                    for (amax, stored, pass) in [(fwd.amax, &y, "forward"), (bwd.amax, &dh, "backward")] {
                        if let Some(amax) = amax {
                            check_fused_amax::<B>(&amax, stored, &format!("{context}: {pass}"));
                        }
                    }
                }
            }
        }
    }
    println!("12 activations within bounds; {fused} fused amaxes and quantizes bit-exact");
    for &dtype in dtypes {
        check_store_rounding::<B>(device, dtype);
    }
}

/// The stores' rounding, exactly: reglu's `relu(x) · g` of two stored halves is exact in f32 (two
/// 8- or 11-bit significands), so the kernel's stored value must be the host's round-to-nearest-
/// even of that product, bit for bit, whichever way the backend rounds (the CUDA conversion
/// instruction, integer rounding on other runtimes). Magnitudes spread over 2^-14..2^9 give
/// products from f16 subnormals to past f16's range (infinity), and many ties.
fn check_store_rounding<B: LowpBackend>(device: &B::Device, dtype: InputDtype) {
    if dtype == InputDtype::F32 {
        return;
    }
    let (rows, f) = (64, 256);
    let mut rng = SplitMix(977);
    let values = (0..rows * 2 * f)
        .map(|_| {
            let magnitude = 2f64.powf(-14.0 + 23.0 * rng.uniform());
            let sign = if rng.uniform() < 0.5 { -1.0 } else { 1.0 };
            dtype.round((sign * magnitude) as f32)
        })
        .collect();
    let h = HostMatrix::new("input", rows, 2 * f, dtype, values).unwrap();
    let spec = ActivationSpec {
        activation: Activation::Reglu,
        params: ActivationParams::default(),
    };
    let y = read_f32::<B>(B::act_forward(upload::<B>(&h, device), &spec, false).unwrap().y);
    for r in 0..rows {
        for c in 0..f {
            let (x, g) = (h.values[r * 2 * f + c], h.values[r * 2 * f + f + c]);
            let want = dtype.round(x.max(0.0) * g);
            let got = y[r * f + c];
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "reglu {} [{r}, {c}]: relu({x:e}) * {g:e} stored as {got:e}, want {want:e}",
                dtype.name()
            );
        }
    }
}

/// A Linear's dbias with dY's amax in the same read (`act_dbias_amax`). Device backends: the
/// column sums bit-equal to the host's f32 sums in the kernel's order (64-row blocks summed in
/// row order, then the blocks in order), the amax bit-equal to the host's and quantizing with it
/// bit-equal to the unfused current-scaling quantize; an odd width falls back to Burn's column
/// sums without an amax. NdArray (Burn's sums) within f32 rounding of the f64 sums.
pub fn check_dbias_amax<B: LowpBackend>(device: &B::Device, dtypes: &[InputDtype], kernels: bool) {
    for &dtype in dtypes {
        // 203 rows: blocks of 64 with a tail that is not a multiple of the kernel's 4-row step;
        // (10, 7): an odd width (the fallback) whose f16 bytes are still a multiple of 4 (wgpu
        // cannot upload a buffer of 126 bytes).
        for (rows, cols) in [(96, 160), (144, 1056), (203, 6), (10, 7)] {
            let mut dy = matrix(rows, cols, dtype, 0.25, 3.0, 7 + (rows * cols) as u64);
            dy.values[cols + 1] = dtype.round(-4000.0);
            if cols % 2 == 1 && matches!(dtype, InputDtype::BF16) {
                // The fallback is Burn's column sums, which wgpu cannot run on BF16 (it holds
                // BF16 as 32-bit words for our kernels only).
                continue;
            }
            let context = format!("dbias {} [{rows}, {cols}]", dtype.name());
            let (dbias, amax) = B::act_dbias_amax(upload::<B>(&dy, device)).unwrap();
            let dbias = read_f32::<B>(dbias);
            let fused = kernels && cols % 2 == 0;
            if fused {
                let blocks: Vec<Vec<f32>> = (0..rows.div_ceil(64))
                    .map(|b| {
                        (0..cols)
                            .map(|c| (b * 64..rows.min(b * 64 + 64)).fold(0.0f32, |s, r| s + dy.values[r * cols + c]))
                            .collect()
                    })
                    .collect();
                let want: Vec<f32> = (0..cols).map(|c| blocks.iter().fold(0.0f32, |s, b| s + b[c])).collect();
                for (c, (g, w)) in dbias.iter().zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), w.to_bits(), "{context}: dbias[{c}] {g} vs {w}");
                }
            } else {
                let want: Vec<f64> = (0..cols)
                    .map(|c| (0..rows).map(|r| dy.values[r * cols + c] as f64).sum())
                    .collect();
                assert_close(&dbias, &want, dtype, 1e-5, &format!("{context}: dbias"));
            }
            assert_eq!(amax.is_some(), fused, "{context}: an amax exactly where the kernel runs");
            match amax {
                // FP8 quantizes need K divisible by 16 on CUDA: compare the amax alone there.
                Some(amax) if cols % 16 != 0 => {
                    let bits = B::bytes_to_host(&amax);
                    let fused = f32::from_le_bytes([bits[0], bits[1], bits[2], bits[3]]);
                    assert_eq!(fused.to_bits(), host_amax(&dy.values).to_bits(), "{context}: fused amax");
                }
                amax => {
                    check_amax_twin::<B>(upload::<B>(&dy, device), amax, &dy.values, &context);
                }
            }
        }
    }
}

/// fc2's input under delayed scaling in one pass (`act_quantize_fp8_with_scale`:
/// the activation as the FP8 cast's prologue) equals the activation pass followed by
/// `quantize_fp8_with_scale` bit for bit: codes and scales in both directions and the amax folded
/// into the history row, every activation and dtype, a scale that saturates some values. Under
/// current scaling (`act_quantize_fp8_current`: an amax pass over the activation,
/// then the cast applying it) it equals the activation pass followed by the plain quantize, with
/// its own amax pass, bit for bit. Backends without the fused kernels (NdArray) answer `None`.
pub fn check_activation_quantize<B: LowpBackend>(device: &B::Device, dtypes: &[InputDtype], kernels: bool) {
    let params = ActivationParams {
        limit: 3.0,
        ..Default::default()
    };
    let usage = Usage {
        rowwise: true,
        columnwise: true,
    };
    for &dtype in dtypes {
        for act in Activation::ALL {
            for (rows, f) in SHAPES {
                let spec = ActivationSpec { activation: act, params };
                let width = if act.is_gated() { 2 * f } else { f };
                let h = matrix(rows, width, dtype, 0.0, 2.5, 307 + (rows * f) as u64 + act as u64);
                let context = format!("{act} {} [{rows}, {width}]", dtype.name());
                let fwd = B::act_forward(upload::<B>(&h, device), &spec, true).unwrap();
                let y = read_f32::<B>(fwd.y.clone());

                // Scale column 1 of three (decoys around it), history row 0
                // column 2 of three; the scale puts the top fifth of the range past E4M3's 448.
                let scale = 448.0 / (0.8 * host_amax(&y).max(1e-6));
                let scales = || ScaleColumns {
                    scales: vector::<B>(vec![0.5, scale, 2.0], InputDtype::F32, device),
                    first: 1,
                    stride: 1,
                };
                let history = || {
                    let m = HostMatrix::new("history", 4, 3, InputDtype::F32, vec![0.0; 12]).unwrap();
                    B::bytes_float_from_host(&m, device)
                };
                let (twin_history, fused_history) = (history(), history());
                let record = |h: &FloatTensor<B>| {
                    B::quantize_delayed_amax_in_place().then(|| AmaxHistoryColumns {
                        history: h.clone(),
                        first: 2,
                        stride: 1,
                    })
                };
                let twin =
                    B::quantize_fp8_with_scale(fwd.y.clone(), Fp8Format::E4M3, scales(), usage, record(&twin_history))
                        .unwrap();
                let fused = B::act_quantize_fp8_with_scale(
                    upload::<B>(&h, device),
                    &spec,
                    Fp8Format::E4M3,
                    scales(),
                    usage,
                    record(&fused_history),
                )
                .unwrap();
                assert_eq!(fused.is_some(), kernels, "{context}: fused exactly where the kernels run");
                if let Some(fused) = fused {
                    assert_bit_equal(
                        &fused.to_host().unwrap(),
                        &twin.to_host().unwrap(),
                        &format!("{context}: fused activation cast"),
                    );
                    let (got, want) = (read_f32::<B>(fused_history), read_f32::<B>(twin_history));
                    assert_eq!(got, want, "{context}: the amax recorded into the history");
                    assert_eq!(got[2].to_bits(), host_amax(&y).to_bits(), "{context}: recorded amax");
                }

                // Current scaling: the amax pass over the activation and the cast applying it,
                // against the stored activation quantized with its own amax pass.
                let current = FormatConfig::Fp8Current(Fp8CurrentScaling::new(Fp8Format::E4M3));
                let twin = B::quantize_tensor(fwd.y.clone(), &current, usage, false).unwrap();
                let fused =
                    B::act_quantize_fp8_current(upload::<B>(&h, device), &spec, &current, usage)
                        .unwrap();
                assert_eq!(fused.is_some(), kernels, "{context}: current scaling fused exactly where the kernels run");
                if let Some(fused) = fused {
                    let (fused, twin) = (fused.to_host().unwrap(), twin.to_host().unwrap());
                    assert_bit_equal(&fused, &twin, &format!("{context}: fused activation cast, current scaling"));
                }
            }
        }
    }
}

/// Shapes the pair kernels cannot take are errors, not panics.
pub fn check_norm_act_bad_shapes<B: LowpBackend>(device: &B::Device, kernels: bool) {
    let x = matrix(4, 7, InputDtype::F32, 0.0, 1.0, 5);
    let spec = ActivationSpec {
        activation: Activation::Swiglu,
        params: ActivationParams::default(),
    };
    if !kernels {
        return; // NdArray's Burn-op reference takes any width.
    }
    let e = B::act_forward(upload::<B>(&x, device), &spec, false).err().expect("odd width refused");
    assert!(e.to_string().contains("even"), "{e}");
    // The fused activation cast: a gated input of odd width, and an output FP8 cannot block.
    let fused_cast = |h: &HostMatrix| {
        let scale = ScaleColumns::whole(vector::<B>(vec![1.0], InputDtype::F32, device));
        B::act_quantize_fp8_with_scale(upload::<B>(h, device), &spec, Fp8Format::E4M3, scale, Usage::ROWWISE, None)
    };
    let e = fused_cast(&x).err().expect("odd gated width refused");
    assert!(e.to_string().contains("two halves"), "{e}");
    let narrow = matrix(16, 24, InputDtype::F32, 0.0, 1.0, 6);
    let e = fused_cast(&narrow).err().expect("an output of 12 columns refused");
    assert!(e.to_string().contains("activation output"), "{e}");
    // Its current-scaling form refuses the same, before any pass runs.
    let current = FormatConfig::Fp8Current(Fp8CurrentScaling::new(Fp8Format::E4M3));
    let fused_current =
        |h: &HostMatrix| B::act_quantize_fp8_current(upload::<B>(h, device), &spec, &current, Usage::ROWWISE);
    let e = fused_current(&x).err().expect("odd gated width refused (current scaling)");
    assert!(e.to_string().contains("two halves"), "{e}");
    let e = fused_current(&narrow).err().expect("an output of 12 columns refused (current scaling)");
    assert!(e.to_string().contains("activation output"), "{e}");
    let e = B::norm_forward(
        upload::<B>(&x, device),
        vector::<B>(vec![1.0; 7], InputDtype::F32, device),
        None,
        &NormSpec { rms: true, eps: 1e-5, zero_centered_gamma: false },
        false,
    )
    .err()
    .expect("odd width refused");
    assert!(e.to_string().contains("even"), "{e}");
}

macro_rules! norm_act_suite {
    ($backend:ty, $device:expr, [$($dtype:expr),*], $kernels:expr) => {
        #[test]
        fn norm_forward_matches_f64_and_its_fused_amax_quantizes_like_the_unfused_twin() {
            if let Some(d) = $device { crate::norm_act::check_norm_forward::<$backend>(&d, &[$($dtype),*]); }
        }

        #[test]
        fn norm_backward_matches_f64() {
            if let Some(d) = $device { crate::norm_act::check_norm_backward::<$backend>(&d, &[$($dtype),*]); }
        }

        #[test]
        fn activations_match_f64_and_their_fused_amax_quantizes_like_the_unfused_twin() {
            if let Some(d) = $device { crate::norm_act::check_activations::<$backend>(&d, &[$($dtype),*]); }
        }

        #[test]
        fn linear_dbias_and_its_fused_amax_match_the_host_and_the_unfused_quantize() {
            if let Some(d) = $device { crate::norm_act::check_dbias_amax::<$backend>(&d, &[$($dtype),*], $kernels); }
        }

        #[test]
        fn activation_fused_into_the_fp8_cast_equals_activation_then_quantize() {
            if let Some(d) = $device { crate::norm_act::check_activation_quantize::<$backend>(&d, &[$($dtype),*], $kernels); }
        }

        #[test]
        fn norm_and_activation_bad_shapes_are_errors() {
            if let Some(d) = $device { crate::norm_act::check_norm_act_bad_shapes::<$backend>(&d, $kernels); }
        }
    };
}
pub(crate) use norm_act_suite;
