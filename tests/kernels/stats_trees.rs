//! The statistics kernels' cube reductions as warp shuffles (where planes are 32 lanes wide:
//! CUDA) give the records of the shared-memory trees bit for bit (`tensor_stats_with_trees`):
//! plain statistics, against a dequantized copy with overflow limits, and against two FP8
//! copies decoded in the pass, with rows labelled by group.

use burn_lowp_kernels::cubecl::prelude::*;
use burn_lowp_kernels::cubecl::server::Handle;
use burn_lowp_kernels::cast::dequantize::Fp8Scales;
use burn_lowp_kernels::grouped::group_layout::RowGroups;
use burn_lowp_kernels::util::matrix::InputMatrix;
use burn_lowp_kernels::util::reduce::planes_of_32;
use burn_lowp_kernels::stats::{
    stats_records, tensor_stats_with_trees, Fp8Codes, Fp8Copy, RowLabels, StatsError, STAT_FIELDS,
};
use burn_lowp_kernels::{ElemKind, Fp8Kind};

use crate::common::SplitMix;

fn upload<R: Runtime>(client: &ComputeClient<R>, words: &[u32]) -> Handle {
    client.create_from_slice(&words.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>())
}

fn read<R: Runtime>(client: &ComputeClient<R>, h: &Handle, len: usize) -> Vec<u8> {
    client.read_one(h.clone()).expect("device read")[..len].to_vec()
}

pub fn check_plane_trees_equal_shared_trees<R: Runtime>(device: &R::Device) {
    let client = R::client(device);
    assert!(planes_of_32(&client), "this runtime was expected to have 32-lane planes");
    let (rows, cols) = (256usize, 2176usize);
    let mut rng = SplitMix(77);
    let values: Vec<f32> = (0..rows * cols)
        .map(|i| if i % 11 == 0 { 0.0 } else { (rng.normal() * (6.0 * rng.uniform() - 3.0).exp2()) as f32 })
        .collect();
    let x = upload(&client, &values.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    let dq: Vec<u32> = values.iter().map(|v| (v * 1.0625).to_bits()).collect();
    let dq = upload(&client, &dq);
    let limits = upload(&client, &[1.5f32.to_bits(), 0.75f32.to_bits()]);
    // FP8 E4M3 codes (no NaN patterns) of both layouts and one scale per group.
    let code_words = |rng: &mut SplitMix| -> Vec<u32> {
        (0..rows * cols / 4)
            .map(|_| {
                let mut w = 0u32;
                for b in 0..4 {
                    w |= ((rng.next_u64() as u32 & 0xFF) % 0x7F) << (8 * b);
                }
                w
            })
            .collect()
    };
    let (rowwise, columnwise) = (upload(&client, &code_words(&mut rng)), upload(&client, &code_words(&mut rng)));
    let scales = upload(&client, &[0.01f32.to_bits(), 0.02f32.to_bits()]);
    // Two groups of 128 rows.
    let labels: Vec<u32> = (0..rows).map(|r| (r / 128) as u32).collect();
    let labels = upload(&client, &labels);
    let (starts, lens) = (upload(&client, &[0, 128]), upload(&client, &[128, 128]));
    let input = InputMatrix { handle: &x, rows, cols, kind: ElemKind::F32 };
    let row_labels = RowLabels { row_group: &labels, count: 2 };
    let decoded = StatsError::Fp8Codes {
        copy: Fp8Copy::Both {
            rowwise: Fp8Codes { codes: &rowwise, scales: &scales },
            columnwise: Fp8Codes { codes: &columnwise, scales: &scales },
        },
        groups: Some(RowGroups { start: &starts, rows: &lens, count: 2 }),
        code_rows: rows,
        fp8: Fp8Kind::E4M3,
        fp8_max: 448.0,
        scales_kind: Fp8Scales::Tensor,
    };
    // (name, error, labels, sets of records)
    let cases: [(&str, Option<StatsError<'_>>, Option<RowLabels<'_>>, usize); 3] = [
        ("plain", None, None, 1),
        ("dequantized copy", Some(StatsError::Dequantized { values: &dq, limits: &limits }), Some(row_labels), 1),
        ("two decoded copies", Some(decoded), Some(row_labels), 2),
    ];
    for (name, error, labels, sets) in cases {
        let len = sets * stats_records(rows, cols) * STAT_FIELDS * 4;
        let shared = tensor_stats_with_trees(&client, input, error, labels, false).unwrap();
        let planes = tensor_stats_with_trees(&client, input, error, labels, true).unwrap();
        let (a, b) = (read(&client, &planes, len), read(&client, &shared, len));
        assert_eq!(a.len(), b.len(), "{name}: lengths");
        assert!(a == b, "{name}: plane trees differ from shared-memory trees");
        assert!(a.iter().any(|&byte| byte != 0), "{name}: records were written");
    }
}

macro_rules! stats_trees_suite {
    ($runtime:ty, $device:expr) => {
        #[test]
        fn plane_trees_equal_shared_memory_trees() {
            if let Some(d) = $device {
                crate::stats_trees::check_plane_trees_equal_shared_trees::<$runtime>(&d);
            }
        }
    };
}
pub(crate) use stats_trees_suite;
