//! The result of a reference quantizer: a logical `[rows, cols]` shape and an optional rowwise and
//! columnwise representation, each with its codes, scales and amax.

use super::codec::Fp8Format;
use super::fp8_block::BlockShape;

/// Which representations a quantizer produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Usage {
    pub rowwise: bool,
    pub columnwise: bool,
}

impl Usage {
    pub const BOTH: Usage = Usage {
        rowwise: true,
        columnwise: true,
    };
    pub const ROWWISE: Usage = Usage {
        rowwise: true,
        columnwise: false,
    };
    pub const COLUMNWISE: Usage = Usage {
        rowwise: false,
        columnwise: true,
    };
}

/// One of the two representations: rowwise (blocks along K) or columnwise (blocks along M).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Direction {
    Rowwise,
    Columnwise,
}

impl Direction {
    pub fn name(self) -> &'static str {
        match self {
            Direction::Rowwise => "rowwise",
            Direction::Columnwise => "columnwise",
        }
    }
}

/// A quantized format, with what it takes to read its codes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum QuantFormat {
    /// FP8 with one f32 scale for the whole tensor (delayed or current scaling).
    /// Columnwise codes are the physical transpose `[K, M]` (Hopper FP8 GEMMs are TN-only).
    Fp8Tensor { fp8: Fp8Format },
    /// FP8 with f32 scales per 1x128 or 128x128 block. Columnwise codes are the transpose `[K, M]`
    /// quantized with blocks along M.
    Fp8Block { fp8: Fp8Format, block: BlockShape },
    /// MXFP8: E8M0 scales per 32 elements (or per 32x32 tile). Columnwise codes stay `[M, K]`.
    Mxfp8 { fp8: Fp8Format, block_2d: bool },
    /// NVFP4: E2M1 codes, E4M3 scales per 16 elements (or 16x16 tile), f32 global amax.
    /// Columnwise codes are the transpose `[K, M/2]`, optionally Hadamard-transformed.
    Nvfp4 {
        block_2d: bool,
        rht: bool,
        stochastic_rounding: bool,
    },
}

impl QuantFormat {
    pub fn name(&self) -> String {
        match self {
            QuantFormat::Fp8Tensor { fp8 } => format!("fp8-{}", fp8.name()),
            QuantFormat::Fp8Block { fp8, block } => {
                format!("fp8-block-{}-{}", block.name(), fp8.name())
            }
            QuantFormat::Mxfp8 { fp8, block_2d } => {
                format!("mxfp8-{}{}", fp8.name(), if *block_2d { "-2d" } else { "" })
            }
            QuantFormat::Nvfp4 {
                block_2d,
                rht,
                stochastic_rounding,
            } => format!(
                "nvfp4{}{}{}",
                if *block_2d { "-2d" } else { "" },
                if *rht { "-rht" } else { "" },
                if *stochastic_rounding { "-sr" } else { "" }
            ),
        }
    }
}

/// Layout of a block-scale byte matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ScaleLayout {
    /// Row-major, padded with zeros to the GEMM's 128x4 tiles.
    Compact,
    /// The cuBLAS 128x4-tile interleaved layout (see `swizzle.rs`).
    Swizzled,
}

/// The scales of one representation.
#[derive(Debug, Clone, PartialEq)]
pub enum Scales {
    /// FP8 per-tensor: the dequantization multiplier `1 / scale`.
    TensorScaleInv(f32),
    /// FP8 block scaling: row-major f32 `scale_inv` per block.
    BlockF32 { shape: [usize; 2], values: Vec<f32> },
    /// MXFP8 (E8M0) or NVFP4 (E4M3) scale bytes. `shape` is always the padded compact shape: rowwise
    /// `[roundup(M,128), roundup(K/b,4)]`, MXFP8 columnwise `[roundup(M/32,4), roundup(K,128)]`,
    /// NVFP4 columnwise `[roundup(K,128), roundup(M/16,4)]`. In the swizzled layout the same bytes
    /// are permuted into 128x4 tiles (MXFP8 columnwise scales swizzled as their transpose).
    BlockBytes {
        shape: [usize; 2],
        bytes: Vec<u8>,
        layout: ScaleLayout,
    },
}

/// One representation (rowwise or columnwise) of a quantized matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedData {
    /// Row-major codes. FP4 holds two codes per byte, the even element in the low nibble.
    pub codes: Vec<u8>,
    /// Shape of `codes` in bytes.
    pub codes_shape: [usize; 2],
    pub scales: Scales,
    /// The amax this representation was scaled from, where the format keeps one: FP8 per-tensor
    /// (the tensor amax, which delayed scaling records) and NVFP4 (with RHT: after the transform).
    /// Block-scaled FP8 and MXFP8 keep none.
    pub amax: Option<f32>,
}

/// A quantized `[rows, cols]` matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct HostQuantized {
    pub format: QuantFormat,
    pub rows: usize,
    pub cols: usize,
    pub rowwise: Option<QuantizedData>,
    pub columnwise: Option<QuantizedData>,
}

impl HostQuantized {
    pub fn data(&self, direction: Direction) -> Option<&QuantizedData> {
        match direction {
            Direction::Rowwise => self.rowwise.as_ref(),
            Direction::Columnwise => self.columnwise.as_ref(),
        }
    }
}
