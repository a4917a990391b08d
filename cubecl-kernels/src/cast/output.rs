//! What a cast produces: which directions (`Directions`) and, per direction, the device buffers
//! of codes, scales and amax (`DirectionOutput`, `QuantizeOutput`).

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::cast::flags;
use crate::util::buffers::filled;

/// Which representations to produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Directions {
    pub rowwise: bool,
    pub columnwise: bool,
}

impl Directions {
    pub(crate) fn flags(self) -> u32 {
        (if self.rowwise { flags::ROWWISE } else { 0 })
            | (if self.columnwise {
                flags::COLUMNWISE
            } else {
                0
            })
    }
}

/// Device buffers of one representation.
#[derive(Debug, Clone)]
pub struct DirectionOutput {
    /// Code bytes (packed in u32 words), row-major in the representation's layout.
    pub codes: Handle,
    /// Block scales (E8M0/E4M3 bytes, or f32 `scale_inv` for FP8 block), or the one f32
    /// `scale_inv` of FP8 per-tensor scaling.
    pub scales: Handle,
    /// f32 amax of the representation, where the format keeps one (FP8 per-tensor, NVFP4).
    pub amax: Option<Handle>,
}

#[derive(Debug, Clone)]
pub struct QuantizeOutput {
    pub rowwise: Option<DirectionOutput>,
    pub columnwise: Option<DirectionOutput>,
}

impl QuantizeOutput {
    /// The outputs of the directions asked for (a kernel allocates both; the other is dropped).
    pub(crate) fn kept(directions: Directions, rowwise: DirectionOutput, columnwise: DirectionOutput) -> Self {
        QuantizeOutput {
            rowwise: directions.rowwise.then_some(rowwise),
            columnwise: directions.columnwise.then_some(columnwise),
        }
    }
}

/// A byte buffer for `[r, c]` scales of which the kernel writes the cells of `written` (rows,
/// columns): zeroed where the shape has padding cells (they must read 0) or `written` is not
/// known (`None`), left as allocated where it has none, since every byte is written and the
/// fill would be a launch and a pass of its own (4 MiB for 16384 x 8192 MXFP8).
pub(crate) fn scale_bytes<R: Runtime>(
    client: &ComputeClient<R>,
    shape: [usize; 2],
    written: Option<[usize; 2]>,
) -> Handle {
    if written == Some(shape) {
        client.empty((shape[0] * shape[1]).max(4))
    } else {
        filled(client, shape[0] * shape[1] / 4, 0)
    }
}
