//! The paths this workspace's vendored CubeCL crates open (`vendor/README.md`): GEMMs ordered
//! with events on CubeCL's stream, and FP8 casts through the saturating hardware conversion on
//! devices that have it (1e4 to E4M3 gives 0x7E). A crate built against the published crates
//! takes the fallbacks instead (`examples/downstream/`, run with `--features cuda` on a GPU).

use burn_lowp::backend::cuda::cublaslt::cubecl_stream_available;
use burn_lowp_kernels::cast::codec::Fp8Encoder;
use burn_lowp_kernels::cast::saturation_probe::{probe_instruction_code, SATURATED_E4M3};
use burn_lowp_kernels::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_lowp_kernels::cubecl::ir::features::TypeUsage;
use burn_lowp_kernels::cubecl::prelude::*;

pub fn check_patched_paths(device: &CudaDevice) {
    assert!(cubecl_stream_available(), "the vendored cubecl-cuda names its stream");
    let client = CudaRuntime::client(device);
    if !burn_lowp_kernels::cubecl::e4m3::supported_uses(&client).contains(TypeUsage::Conversion) {
        println!("no FP8 conversion on this device (before sm_89): the integer encoder runs");
        assert_eq!(burn_lowp_kernels::fp8_encoder(&client), Fp8Encoder::Integer);
        return;
    }
    assert_eq!(probe_instruction_code(&client), Some(SATURATED_E4M3), "1e4 to E4M3 by the instruction path");
    burn_lowp_kernels::force_integer_fp8_encoder(false);
    assert_eq!(burn_lowp_kernels::fp8_encoder(&client), Fp8Encoder::Instruction);
    println!("{}", burn_lowp::backend::cuda::active_paths(device.index));
}

macro_rules! patched_paths_suite {
    ($device:expr) => {
        #[test]
        fn vendored_cubecl_gives_event_ordering_and_saturating_fp8_casts() {
            if let Some(d) = $device {
                crate::patched_paths::check_patched_paths(&d);
            }
        }
    };
}
pub(crate) use patched_paths_suite;
