//! `lowp inspect`: how much precision each format loses on every tensor of a checkpoint.

use burn_lowp::debug::QuantizationError;
use burn_lowp::error::{LowpError, Result};
use burn_lowp::format::{scaling::amax, Direction, HostMatrix, Usage};
use burn_lowp::tensor_file::TensorFile;

use crate::args::{CliFormat, InspectArgs};
use crate::quantize::{quantize, QuantizeOptions};

/// The default formats `lowp inspect` measures.
pub const INSPECT_DEFAULT_FORMATS: [CliFormat; 4] = [
    CliFormat::Fp8E4m3,
    CliFormat::Fp8Block1x128,
    CliFormat::Mxfp8E4m3,
    CliFormat::Nvfp4,
];

/// Rowwise quantization error of `x` in `format`.
pub fn measure(x: &HostMatrix, format: CliFormat) -> Result<QuantizationError> {
    let options = QuantizeOptions {
        seed: (format == CliFormat::Nvfp4Sr).then_some(0),
        ..Default::default()
    };
    let q = quantize(x, format, &options, Usage::ROWWISE)?;
    QuantizationError::measure(&x.values, &q.dequantize(Direction::Rowwise)?)
}

/// `lowp inspect`: a precision report for every tensor of a file.
pub fn run_inspect(args: &InspectArgs) -> Result<String> {
    let file = TensorFile::open(&args.input)?;
    let formats: Vec<CliFormat> = if args.format.is_empty() {
        INSPECT_DEFAULT_FORMATS.to_vec()
    } else {
        args.format.clone()
    };
    let mut report = String::new();
    for name in file.names()? {
        let raw_shape = file.raw(&name)?.shape;
        let x = match file.read_matrix(&name) {
            Ok(x) => x,
            Err(LowpError::Dtype { dtype, .. }) => {
                report.push_str(&format!(
                    "{name}  shape {raw_shape:?}  dtype {dtype}  (skipped: not a float tensor)\n"
                ));
                continue;
            }
            Err(e) => return Err(e),
        };
        report.push_str(&format!(
            "{name}  shape {raw_shape:?}  dtype {}  amax {:.6e}\n",
            x.dtype.name(),
            amax(&x.values)
        ));
        for &format in &formats {
            match measure(&x, format) {
                Ok(e) => report.push_str(&format!(
                    "  {:<18} underflow {:>8.4}%  mse {:.6e}\n",
                    format.name(),
                    e.underflow_pct,
                    e.mse
                )),
                Err(e @ LowpError::Shape { .. }) => {
                    report.push_str(&format!("  {:<18} n/a: {e}\n", format.name()))
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(report)
}
