//! An MoE layer's token routing (`ops::token_routing`) on every backend, against host
//! computations written out here: the top-k choice, the stable counting sort of the assignments
//! by expert, the routes into the aligned layout, `combine` and its two gradients, and
//! `dispatch` / `combine` with autodiff.
//!
//! Integer maps and the unweighted moves are exact. The weighted sums may differ in the last
//! place on GPUs (a product and a sum contracted into one fused multiply-add), hence one unit in
//! the last place of the dtype; the weights' gradient is a dot product summed in another order.
#![allow(dead_code)]

use burn::backend::Autodiff;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Int, Tensor, TensorData};
use burn_lowp::backend::LowpBackend;
use burn_lowp::format::grouped::group_layout;
use burn_lowp::format::{HostMatrix, InputDtype};
use burn_lowp::ops::token_routing::{combine, dispatch, token_routes};
use burn_lowp::ops::{LowpLinear, TokenRoutes};

use crate::common::{read_f32, SplitMix};
use crate::fused::{assert_close, values};

fn ints<B: LowpBackend>(t: IntTensor<B>) -> Vec<i64> {
    burn::tensor::read_sync(B::int_into_data(t)).unwrap().convert::<i64>().into_vec().unwrap()
}

fn int_tensor<B: LowpBackend>(values: &[i64], device: &B::Device) -> IntTensor<B> {
    Tensor::<B, 1, Int>::from_data(TensorData::new(values.to_vec(), [values.len()]), device).into_primitive()
}

fn matrix<B: LowpBackend>(rows: usize, cols: usize, values: Vec<f32>, dtype: InputDtype, device: &B::Device) -> FloatTensor<B> {
    B::bytes_float_from_host(&HostMatrix::new("m", rows, cols, dtype, values).unwrap(), device)
}

/// Experts of `n` assignments in `0..experts`, expert 1 never chosen (an empty group).
fn random_experts(n: usize, experts: usize, seed: u64) -> Vec<i64> {
    let mut rng = SplitMix(seed);
    (0..n)
        .map(|_| {
            let e = (rng.next_u64() % experts as u64) as i64;
            if e == 1 && experts > 2 { 0 } else { e }
        })
        .collect()
}

/// Host stable counting sort: loads and packed positions.
fn host_positions(expert: &[i64], experts: usize) -> (Vec<i64>, Vec<i64>) {
    let mut counts = vec![0i64; experts];
    for &e in expert {
        counts[e as usize] += 1;
    }
    let mut next: Vec<i64> = counts.iter().scan(0, |s, &c| { let start = *s; *s += c; Some(start) }).collect();
    let position = expert.iter().map(|&e| { let p = next[e as usize]; next[e as usize] += 1; p }).collect();
    (counts, position)
}

/// Top-k of scores with ties (values on a grid of 0.25) against a host sort (largest first,
/// ties to the lower expert), for T not a multiple of the kernel's cube; bad k are errors.
pub fn check_top_k<B: LowpBackend>(device: &B::Device) {
    let (tokens, experts) = (300, 16);
    let mut rng = SplitMix(7);
    let scores: Vec<f32> = (0..tokens * experts).map(|_| (rng.normal() * 4.0).round() as f32 / 4.0).collect();
    for k in [1, 3, 16] {
        let got = ints::<B>(B::route_top_k(matrix::<B>(tokens, experts, scores.clone(), InputDtype::F32, device), k).unwrap());
        for (t, row) in scores.chunks(experts).enumerate() {
            let mut order: Vec<usize> = (0..experts).collect();
            order.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).unwrap().then(a.cmp(&b)));
            let want: Vec<i64> = order[..k].iter().map(|&e| e as i64).collect();
            assert_eq!(&got[t * k..(t + 1) * k], &want[..], "top {k}, token {t}");
        }
    }
    for k in [0, 17] {
        let err = B::route_top_k(matrix::<B>(tokens, experts, scores.clone(), InputDtype::F32, device), k).unwrap_err();
        assert!(err.to_string().contains("router scores"), "{err}");
    }
}

/// The counting sort against the host's, with several chunks, more experts than a cube has
/// units and an empty expert; an empty batch is an error.
pub fn check_expert_positions<B: LowpBackend>(device: &B::Device) {
    for (n, experts, seed) in [(1000, 8, 1), (700, 300, 2), (5, 4, 3)] {
        let expert = random_experts(n, experts, seed);
        let (want_counts, want_position) = host_positions(&expert, experts);
        let (counts, position) = B::route_expert_positions(int_tensor::<B>(&expert, device), experts).unwrap();
        assert_eq!(ints::<B>(counts), want_counts, "{n} assignments, {experts} experts: loads");
        assert_eq!(ints::<B>(position), want_position, "{n} assignments, {experts} experts: positions");
    }
    let err = B::route_expert_positions(int_tensor::<B>(&[], device), 3).unwrap_err();
    assert!(err.to_string().contains("assignments' experts"), "{err}");
}

/// Routes for `tokens` tokens of k choices among `experts` experts.
fn routes<B: LowpBackend>(tokens: usize, k: usize, experts: usize, seed: u64, device: &B::Device) -> (TokenRoutes<B>, Vec<i64>, Vec<i64>) {
    let n = tokens * k;
    let expert = random_experts(n, experts, seed);
    let (counts, position) = host_positions(&expert, experts);
    let layout = B::grouped_layout(int_tensor::<B>(&counts, device), n).unwrap();
    // Wait for the splits' host copy (and check them) before launching more: on wgpu, a launch
    // while CubeCL's staging buffer of that read is still mapped failed validation.
    layout.check().unwrap();
    let routes = B::route_rows(int_tensor::<B>(&position, device), &layout, k).unwrap();
    (routes, counts, position)
}

/// The routes against the host layout's row maps composed with the positions.
pub fn check_route_rows<B: LowpBackend>(device: &B::Device) {
    let (tokens, k, experts) = (300, 2, 8);
    let n = tokens * k;
    let (routes, counts, position) = routes::<B>(tokens, k, experts, 5, device);
    let splits: Vec<i32> = counts.iter().map(|&c| c as i32).collect();
    let host = group_layout(&splits, n);
    let assignment_row: Vec<i64> = position.iter().map(|&p| host.packed_to_aligned[p as usize] as i64).collect();
    let mut assignment_at = vec![0i64; n];
    for (a, &p) in position.iter().enumerate() {
        assignment_at[p as usize] = a as i64;
    }
    let row_assignment: Vec<i64> = host
        .aligned_to_packed
        .iter()
        .map(|&p| if (p as usize) < n { assignment_at[p as usize] } else { n as i64 })
        .collect();
    let row_token: Vec<i64> = row_assignment.iter().map(|a| a / k as i64).collect();
    assert_eq!((routes.tokens, routes.top_k, routes.rows), (tokens, k, host.rows));
    assert_eq!(ints::<B>(routes.assignment_row.clone()), assignment_row, "assignment rows");
    assert_eq!(ints::<B>(routes.row_assignment.clone()), row_assignment, "row assignments");
    assert_eq!(ints::<B>(routes.row_token.clone()), row_token, "row tokens");
}

/// `combine` (weighted and not) and its gradients against host loops, per dtype, for rows of 24
/// columns (whole 16-byte vectors in bf16 and f32: the backward's vector kernel) and of 22 (its
/// pair kernel).
pub fn check_combine<B: LowpBackend>(device: &B::Device, dtypes: &[InputDtype]) {
    let (tokens, k, experts) = (50, 3, 4);
    let n = tokens * k;
    let (routes, _, _) = routes::<B>(tokens, k, experts, 6, device);
    let rows_of = ints::<B>(routes.assignment_row.clone());
    let row_assignment = ints::<B>(routes.row_assignment.clone());
    let rows = routes.rows;
    let weights = values(n, 8, 1.0, InputDtype::F32);
    for (cols, &dtype) in [24, 22].into_iter().flat_map(|cols| dtypes.iter().map(move |d| (cols, d))) {
        let context = format!("{dtype:?} cols {cols}");
        let y = values(rows * cols, 9, 1.0, dtype);
        let dout = values(tokens * cols, 10, 1.0, dtype);
        let y_t = || matrix::<B>(rows, cols, y.clone(), dtype, device);
        let dout_t = || matrix::<B>(tokens, cols, dout.clone(), dtype, device);
        let w_t = || matrix::<B>(tokens, k, weights.clone(), InputDtype::F32, device);
        let host_combine = |weighted: bool| -> Vec<f32> {
            let mut out = Vec::with_capacity(tokens * cols);
            for t in 0..tokens {
                for c in 0..cols {
                    let mut s = 0.0f32;
                    for j in 0..k {
                        let r = rows_of[t * k + j] as usize;
                        let w = if weighted { weights[t * k + j] } else { 1.0 };
                        s += w * y[r * cols + c];
                    }
                    out.push(dtype.round(s));
                }
            }
            out
        };
        let got = read_f32::<B>(B::route_combine_rows(y_t(), Some(w_t()), &routes).unwrap());
        let ulp = match dtype {
            InputDtype::F32 => 2f32.powi(-22),
            InputDtype::F16 => 2f32.powi(-10),
            InputDtype::BF16 => 2f32.powi(-7),
        };
        assert_close(&got, &host_combine(true), ulp, 1e-6, &format!("{context} combine"));
        let got = read_f32::<B>(B::route_combine_rows(y_t(), None, &routes).unwrap());
        assert_eq!(got, host_combine(false), "{context} combine without weights");

        // y's gradient: w[a] · dout[t] on the row of assignment a, zeros elsewhere (one rounding).
        let mut want = vec![0.0f32; rows * cols];
        for (r, &a) in row_assignment.iter().enumerate() {
            if (a as usize) < n {
                let t = a as usize / k;
                for c in 0..cols {
                    want[r * cols + c] = dtype.round(weights[a as usize] * dout[t * cols + c]);
                }
            }
        }
        let got = read_f32::<B>(B::route_combine_rows_backward(dout_t(), Some(w_t()), &routes).unwrap());
        assert_eq!(got, want, "{context} combine backward");

        // The weights' gradient: each assignment's row dotted with its token's gradient.
        let want: Vec<f32> = (0..n)
            .map(|a| {
                let (r, t) = (rows_of[a] as usize, a / k);
                (0..cols).map(|c| dout[t * cols + c] as f64 * y[r * cols + c] as f64).sum::<f64>() as f32
            })
            .collect();
        let got = read_f32::<B>(B::route_combine_weights_grad(dout_t(), y_t(), &routes).unwrap());
        assert_close(&got, &want, 1e-5, 1e-5, &format!("{context} combine weights' gradient"));
    }
}

/// `combine(dispatch(x), w)` on `Autodiff<B>`: each token comes back as `Σ_j w[t, j] · x[t]`; the
/// gradients of `sum(out · g)` are `Σ_j w[t, j] · g[t]` for x and `<g[t], x[t]>` for w.
pub fn check_dispatch_combine_gradients<B: LowpBackend>(device: &B::Device) {
    type A<B> = Autodiff<B>;
    let (tokens, k, experts, cols) = (40, 2, 4, 16);
    let n = tokens * k;
    let expert = random_experts(n, experts, 11);
    let (counts, position) = host_positions(&expert, experts);
    let x_values = values(tokens * cols, 12, 1.0, InputDtype::F32);
    let w_values = values(n, 13, 1.0, InputDtype::F32);
    let g_values = values(tokens * cols, 14, 1.0, InputDtype::F32);
    let float = |v: &[f32], shape: [usize; 2]| Tensor::<A<B>, 2>::from_data(TensorData::new(v.to_vec(), shape), device);
    let x = float(&x_values, [tokens, cols]).require_grad();
    let w = float(&w_values, [tokens, k]).require_grad();
    let layout = <A<B> as LowpLinear>::lowp_group_layout(int_tensor::<B>(&counts, device), n).unwrap();
    layout.check().unwrap();
    let position = Tensor::<A<B>, 1, Int>::from_primitive(int_tensor::<B>(&position, device));
    let routes = token_routes::<A<B>>(position, &layout, k).unwrap();
    let packed = dispatch(x.clone(), &routes).unwrap();
    assert_eq!(packed.dims(), [routes.rows, cols]);
    let out = combine(packed, w.clone(), &routes).unwrap();
    let grads = (out.clone() * float(&g_values, [tokens, cols])).sum().backward();
    let read = |t: Tensor<B, 2>| read_f32::<B>(t.into_primitive().tensor());
    let (mut want_out, mut want_dx, mut want_dw) = (vec![], vec![], vec![]);
    for t in 0..tokens {
        for c in 0..cols {
            let (mut o, mut d) = (0.0f32, 0.0f32);
            for j in 0..k {
                o += w_values[t * k + j] * x_values[t * cols + c];
                d += w_values[t * k + j] * g_values[t * cols + c];
            }
            want_out.push(o);
            want_dx.push(d);
        }
        let dot: f64 = (0..cols).map(|c| g_values[t * cols + c] as f64 * x_values[t * cols + c] as f64).sum();
        want_dw.extend(std::iter::repeat_n(dot as f32, k));
    }
    assert_close(&read(out.inner()), &want_out, 2e-6, 1e-6, "dispatch + combine");
    assert_close(&read(x.grad(&grads).unwrap()), &want_dx, 2e-6, 1e-6, "dx");
    assert_close(&read(w.grad(&grads).unwrap()), &want_dw, 1e-5, 1e-5, "dw");
}

macro_rules! routing_suite {
    ($backend:ty, $device:expr, $dtypes:expr) => {
        mod routing {
            use super::*;

            #[test]
            fn top_k_matches_a_host_sort() {
                if let Some(d) = $device {
                    crate::routing::check_top_k::<$backend>(&d);
                }
            }

            #[test]
            fn expert_positions_match_a_host_counting_sort() {
                if let Some(d) = $device {
                    crate::routing::check_expert_positions::<$backend>(&d);
                }
            }

            #[test]
            fn route_rows_match_the_host_layout() {
                if let Some(d) = $device {
                    crate::routing::check_route_rows::<$backend>(&d);
                }
            }

            #[test]
            fn combine_and_its_gradients_match_host_loops() {
                if let Some(d) = $device {
                    crate::routing::check_combine::<$backend>(&d, &$dtypes);
                }
            }

            #[test]
            fn dispatch_and_combine_differentiate_as_their_formulas() {
                if let Some(d) = $device {
                    crate::routing::check_dispatch_combine_gradients::<$backend>(&d);
                }
            }
        }
    };
}
pub(crate) use routing_suite;
