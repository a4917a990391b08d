//! What a cast produces: which directions (`Directions`) and, per direction, the device buffers
//! of codes, scales and amax (`DirectionOutput`, `QuantizeOutput`). The block-scaled casts
//! (MXFP8, NVFP4, FP8 blocks) write both directions' codes and scales from one read; their
//! kernels take those four arrays as one argument (`CastOutputs`), which their launchers build
//! from one set of buffers (`CastBuffers`).

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::cast::flags;
use crate::util::buffers::{arg, dummy, filled};

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

/// The arrays a block-scaled cast kernel writes: each direction's codes and block scales. Codes
/// are u32 words (`C = u32`), or vectors of them where a kernel stores its columnwise codes so;
/// scales are bytes (E8M0 / E4M3: `S = u8`) or f32 bits (`S = u32`). A direction not asked for
/// gets a placeholder its kernel does not write.
#[derive(CubeType, CubeLaunch)]
pub struct CastOutputs<C: CubePrimitive, S: CubePrimitive> {
    pub rowwise: Array<u32>,
    pub rowwise_scales: Array<S>,
    pub columnwise: Array<C>,
    pub columnwise_scales: Array<S>,
}

/// The host side of `CastOutputs`: the buffers of the directions asked for (placeholders for the
/// others) and the elements each array argument covers.
pub(crate) struct CastBuffers {
    rowwise: Handle,
    rowwise_scales: Handle,
    columnwise: Handle,
    columnwise_scales: Handle,
    /// u32 words of codes, either direction.
    code_words: usize,
    /// Scale elements of each direction.
    scale_len: [usize; 2],
}

impl CastBuffers {
    /// `code_bytes` of codes per direction asked for, and its scales from `rowwise_scales` /
    /// `columnwise_scales` (the buffer, made only for a direction asked for, and its number of
    /// elements), allocated in that order.
    pub(crate) fn new<R: Runtime>(
        client: &ComputeClient<R>,
        directions: Directions,
        code_bytes: usize,
        rowwise_scales: (impl FnOnce() -> Handle, usize),
        columnwise_scales: (impl FnOnce() -> Handle, usize),
    ) -> Self {
        let codes = |on: bool| if on { client.empty(code_bytes) } else { dummy(client) };
        let rowwise = codes(directions.rowwise);
        let row_scales = if directions.rowwise { rowwise_scales.0() } else { dummy(client) };
        let columnwise = codes(directions.columnwise);
        let col_scales = if directions.columnwise { columnwise_scales.0() } else { dummy(client) };
        CastBuffers {
            rowwise,
            rowwise_scales: row_scales,
            columnwise,
            columnwise_scales: col_scales,
            code_words: code_bytes / 4,
            scale_len: [rowwise_scales.1, columnwise_scales.1],
        }
    }

    /// The kernel argument over all four buffers.
    pub(crate) fn arg<R: Runtime, C: CubePrimitive, S: CubePrimitive>(&self) -> CastOutputsLaunch<C, S, R> {
        CastOutputsLaunch::new(
            arg(&self.rowwise, self.code_words),
            arg(&self.rowwise_scales, self.scale_len[0]),
            arg(&self.columnwise, self.code_words),
            arg(&self.columnwise_scales, self.scale_len[1]),
        )
    }

    /// The rowwise codes and scales alone, for the rowwise-only kernels.
    pub(crate) fn rowwise_args<R: Runtime>(&self) -> (ArrayArg<R>, ArrayArg<R>) {
        (
            arg(&self.rowwise, self.code_words),
            arg(&self.rowwise_scales, self.scale_len[0]),
        )
    }

    /// The outputs of the directions asked for, with each direction's amax where the format
    /// keeps one.
    pub(crate) fn into_output(self, directions: Directions, amax: Option<[Handle; 2]>) -> QuantizeOutput {
        let [rowwise_amax, columnwise_amax] = amax.map_or([None, None], |[r, c]| [Some(r), Some(c)]);
        QuantizeOutput::kept(
            directions,
            DirectionOutput {
                codes: self.rowwise,
                scales: self.rowwise_scales,
                amax: rowwise_amax,
            },
            DirectionOutput {
                codes: self.columnwise,
                scales: self.columnwise_scales,
                amax: columnwise_amax,
            },
        )
    }
}
