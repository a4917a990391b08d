//! `LowpBackend`: the operations burn-lowp adds to a Burn backend. Implemented for
//! `CubeBackend<R, ..>` (the CubeCL kernels, on CUDA or wgpu) and for `NdArray` (the reference
//! quantizers), so modules written against `B: LowpBackend` run on both.

use std::ops::Range;

use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};

use crate::error::Result;
use crate::format::grouped::GroupScaling;
use crate::format::{Direction, FormatConfig, Fp8Format, HostMatrix, Usage};

#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod cube;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod cube_norm_act;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod cube_optim;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod cube_routing;
#[cfg(feature = "cuda")]
pub mod cublaslt;
#[cfg(feature = "cuda")]
pub mod cuda_gemm;
#[cfg(feature = "cuda")]
mod cuda_batched;
#[cfg(feature = "cuda")]
pub mod cuda_grouped;
#[cfg(feature = "cuda")]
pub mod sm90_grouped;
pub mod activation;
pub mod attention;
pub mod device;
pub mod gemm;
pub mod gemm_profile;
pub mod gemm_tuning;
pub mod grouped;
pub mod host_copy;
pub mod host_sync;
pub mod norm_act;
pub mod optim;
pub mod packed_rows;
pub mod quantized;
pub mod routing;

pub use gemm::{GemmCall, GemmKind, GemmOptions, GemmPath, SplitAccumulator, Transposes};
pub use gemm_profile::{gemm_profile, set_gemm_profiling, GemmPhase};
pub use gemm_tuning::{load_gemm_tuning, save_gemm_tuning};
pub use grouped::{
    per_group_pays, BatchedOperands, GroupLayout, GroupedFp8Scaling, GroupedGemmPath,
    GroupEpilogue, GroupedOperand, Groups, InputRows, RowGroup,
};
pub use host_sync::{host_syncs, HostSyncs};
pub use quantized::{AmaxHistoryColumns, QuantizedStorage, QuantizedTensor, ScaleColumns, Storage, StorageScales};
pub(crate) use quantized::last_column;
pub use norm_act::{ActivationOutput, NormBackward, NormForward, NormSpec};
#[cfg(feature = "ndarray")]
pub mod ndarray;

pub trait LowpBackend: Backend {
    /// A device buffer of raw bytes (codes, scales, amaxes).
    type Bytes: Clone + std::fmt::Debug + Send + Sync + 'static;

    /// Quantizes `x` (any rank, viewed as `[prod(leading dims), last dim]`), producing the
    /// representations in `usage`. With `optimize_for_gemm`, MXFP8/NVFP4 scales are written
    /// GEMM-swizzled.
    fn lowp_quantize(
        x: FloatTensor<Self>,
        config: &FormatConfig,
        usage: Usage,
        optimize_for_gemm: bool,
    ) -> Result<QuantizedTensor<Self>>;

    /// Whether `quantize_fp8_with_scale[_grouped]` fold the amaxes into the module's history
    /// (`AmaxHistoryColumns`) in the cast's own launch (CubeBackend). Where not (NdArray) they
    /// ignore `record`, and the caller records the result's amaxes with tensor ops.
    fn delayed_amax_in_place() -> bool {
        false
    }

    /// FP8 per-tensor quantization with a given scale (delayed scaling): `scale` is one column
    /// of f32 scales on the device; the result records this tensor's amax, and where
    /// `delayed_amax_in_place`, `record` also receives it (an atomic max into the history).
    fn quantize_fp8_with_scale(
        x: FloatTensor<Self>,
        fp8: Fp8Format,
        scale: ScaleColumns<Self>,
        usage: Usage,
        record: Option<AmaxHistoryColumns<Self>>,
    ) -> Result<QuantizedTensor<Self>>;

    /// TE's delayed-scaling end-of-step update of one module direction: from the amax history
    /// `[len, width]` and scales `[width]` (f32), the new scales (`numerator / amax` of the
    /// history's max, or of row 0 under `most_recent`; a zero or non-finite amax keeps the old
    /// scale) and the rolled history with a zero row 0. The default is tensor ops
    /// (`quant::delayed::delayed_update_by_ops`, about fourteen launches); CubeBackend runs one
    /// kernel (`kernels::delayed_scaling`), bit for bit the same.
    fn lowp_delayed_update(
        history: FloatTensor<Self>,
        scale: FloatTensor<Self>,
        numerator: f32,
        most_recent: bool,
    ) -> Result<(FloatTensor<Self>, FloatTensor<Self>)> {
        crate::quant::delayed::delayed_update_by_ops::<Self>(history, scale, numerator, most_recent)
    }

    /// Dequantizes one representation to an f32 `[rows, cols]` tensor. Block scales must be compact.
    fn lowp_dequantize(
        q: &QuantizedTensor<Self>,
        direction: Direction,
    ) -> Result<FloatTensor<Self>>;

    /// Rewrites MXFP8/NVFP4 block scales into the GEMM-swizzled layout.
    fn swizzle_scales(q: QuantizedTensor<Self>) -> Result<QuantizedTensor<Self>>;

    /// Rewrites swizzled block scales back into the compact layout.
    fn unswizzle_scales(q: QuantizedTensor<Self>) -> Result<QuantizedTensor<Self>>;

    /// Reads a device buffer back (synchronizes).
    fn bytes_to_host(bytes: &Self::Bytes) -> Vec<u8>;

    /// Starts copying device buffers to the host and returns what waits for them: on CUDA the
    /// copies are queued now (into pinned memory) and the closure blocks only if they have not
    /// arrived when it is called. Elsewhere the buffers are read at once.
    fn bytes_to_host_later(
        bytes: Vec<Self::Bytes>,
    ) -> Box<dyn FnOnce() -> Result<Vec<Vec<u8>>> + Send> {
        let read: Vec<Vec<u8>> = bytes.iter().map(Self::bytes_to_host).collect();
        Box::new(move || Ok(read))
    }

    /// Uploads bytes to a device buffer.
    fn bytes_from_host(bytes: Vec<u8>, device: &Self::Device) -> Self::Bytes;

    /// The device a buffer lives on.
    fn bytes_device(bytes: &Self::Bytes) -> Self::Device;

    /// Bytes `range` of a buffer: a view where the backend can make one, else a copy.
    fn bytes_slice(bytes: &Self::Bytes, range: Range<usize>) -> Self::Bytes;

    /// The aligned layout (`grouped::GroupLayout`) of `tokens` packed tokens split into groups by
    /// `m_splits` (one Int per group, on the device), made without reading the splits on the
    /// host; their host copy is requested at once. Errors only on what the host knows (the
    /// shape); the splits' own check is read with their host copy (`GroupLayout::check`).
    fn group_layout(m_splits: IntTensor<Self>, tokens: usize) -> Result<GroupLayout<Self>>;

    /// Quantizes a grouped `[rows, cols]` matrix (`format::grouped`): each group as its slice
    /// alone would be, laid out group after group. Compact scales. FP8 current scaling under
    /// `GroupScaling::Shared` gives every group the scale of the largest group amax (storages
    /// marked `shared_scale`); other formats ignore `scaling`.
    fn lowp_quantize_grouped(
        x: FloatTensor<Self>,
        groups: &Groups<Self>,
        config: &FormatConfig,
        usage: Usage,
        scaling: GroupScaling,
    ) -> Result<QuantizedTensor<Self>>;

    /// FP8 per-tensor quantization of a grouped matrix with each group's given scale (delayed
    /// scaling): `scales` holds one f32 column per group; the result records each group's amax
    /// (and `record` receives them, as in `quantize_fp8_with_scale`). Under
    /// `GroupScaling::Shared` every group takes the smallest given scale.
    fn quantize_fp8_with_scale_grouped(
        x: FloatTensor<Self>,
        fp8: Fp8Format,
        scales: ScaleColumns<Self>,
        groups: &Groups<Self>,
        usage: Usage,
        scaling: GroupScaling,
        record: Option<AmaxHistoryColumns<Self>>,
    ) -> Result<QuantizedTensor<Self>>;

    /// FP8 per-tensor grouped quantization of the packed token rows `x [layout.tokens, cols]`
    /// in `layout`'s aligned layout: exactly `lowp_quantize_grouped` (current scaling) or
    /// `quantize_fp8_with_scale_grouped` (delayed) of the padded batch
    /// `move_rows(x, layout, RowMove::Pad)`. The default pads, then quantizes; CubeBackend's
    /// amax and cast kernels read `x` through the layout's row map, so the padded copy is never
    /// written (a GroupedLinear forward saves a write and a read of its input).
    fn quantize_fp8_grouped_padded(
        x: FloatTensor<Self>,
        layout: &GroupLayout<Self>,
        scaling: grouped::GroupedFp8Scaling<Self>,
        usage: Usage,
        group_scaling: GroupScaling,
    ) -> Result<QuantizedTensor<Self>> {
        grouped::quantize_fp8_padded_after_move(x, layout, scaling, usage, group_scaling)
    }

    /// The experts' bias gradient, f32 `[groups, cols]`: the column sums of each group's rows of
    /// `dy` (the aligned batch or the packed tokens, as `rows` says), and with `amax` the
    /// per-group amaxes (f32 bits, `[groups]`) where the backend takes them in the same read
    /// (CubeBackend; FP8 current scaling of dY then skips its amax pass). The default pads
    /// packed rows and sums with `grouped_column_sum`, and returns no amax.
    fn grouped_dbias_amax(
        dy: FloatTensor<Self>,
        rows: grouped::InputRows,
        layout: &GroupLayout<Self>,
        amax: bool,
    ) -> Result<(FloatTensor<Self>, Option<Self::Bytes>)> {
        let _ = amax;
        Ok((grouped::grouped_dbias_after_move(dy, rows, layout)?, None))
    }

    /// `lowp_grouped_gemm`, except that a grouped FP8 GEMM on per-group scales whose per-group
    /// scaling would be a pass over its output (CUDA's pointer array) may leave that pass to the
    /// caller: it then returns the unit-scale output and the two operands' per-group `scale_inv`
    /// (f32 `[groups]`, operand `a`'s then `b`'s) that group g's rows are to be multiplied by
    /// (`lowp_group_epilogue` applies them with the biases and the unpad in one pass). The
    /// default applies them itself.
    #[allow(clippy::type_complexity)]
    fn lowp_grouped_gemm_unscaled(
        kind: GemmKind,
        a: GroupedOperand<Self>,
        b: GroupedOperand<Self>,
        options: GemmOptions<Self>,
    ) -> Result<(FloatTensor<Self>, Option<(FloatTensor<Self>, FloatTensor<Self>)>)> {
        Ok((Self::lowp_grouped_gemm(kind, a, b, options)?, None))
    }

    /// One GEMM per group (`GemmKind` per group, see `grouped::grouped_output_shape`). The
    /// default runs each group's GEMM on the host-known groups (`grouped_gemm_per_group`); CUDA
    /// runs fprop and dgrad of BF16 and FP8 per-tensor operands as one graph-safe cuBLASLt call,
    /// or per group where the splits' host copy has arrived and that is faster
    /// (`grouped::per_group_pays`).
    fn lowp_grouped_gemm(
        kind: GemmKind,
        a: GroupedOperand<Self>,
        b: GroupedOperand<Self>,
        options: GemmOptions<Self>,
    ) -> Result<FloatTensor<Self>> {
        grouped::grouped_gemm_per_group(kind, a, b, options)
    }

    /// The path `lowp_grouped_gemm` takes for these operands.
    fn grouped_gemm_path(
        _kind: GemmKind,
        _a: GroupedOperand<Self>,
        _b: GroupedOperand<Self>,
    ) -> GroupedGemmPath {
        GroupedGemmPath::PerGroup(GemmPath::DequantizeMatmul)
    }

    /// `Σ` over each group's token rows of an aligned `[rows, cols]` tensor: `[groups, cols]`
    /// (the grouped bias gradient). The default reads the groups on the host.
    fn grouped_column_sum(
        t: FloatTensor<Self>,
        layout: &GroupLayout<Self>,
    ) -> Result<FloatTensor<Self>> {
        grouped::grouped_column_sum_per_group(t, &layout.groups)
    }

    /// Rows of `t [rows, cols]` picked by `index [n]`: `[n, cols]` whose row r is `t`'s row
    /// `index[r]`, or zeros where `index[r] >= rows` (padding reads "one past the last row").
    /// Moves token rows between packed and aligned layouts (`ops::grouped_rows`). The default
    /// appends a zero row and runs Burn's `select`; CubeBackend gathers rows in one kernel.
    fn lowp_gather_rows(t: FloatTensor<Self>, index: IntTensor<Self>) -> FloatTensor<Self> {
        crate::ops::grouped_rows::select_rows_or_zero::<Self>(t, index)
    }

    /// The epilogue of a grouped GEMM's output `y [rows, cols]` whose row r belongs to group
    /// `row_group[r]` (`grouped::GroupEpilogue`): group g's rows multiplied by
    /// `scale_a[g] * scale_b[g]` and `bias[g]` added (rows of no group, `row_group[r] >= groups`,
    /// scaled by 0 and biased by 0), each step rounded to y's dtype; with a gather index, row r
    /// of the result is that of y row `gather[r]` (an aligned output unpadded to its tokens,
    /// `GroupLayout::packed_to_aligned`). The default runs Burn ops; CubeBackend one kernel.
    fn lowp_group_epilogue(
        y: FloatTensor<Self>,
        row_group: IntTensor<Self>,
        epilogue: grouped::GroupEpilogue<Self>,
    ) -> FloatTensor<Self> {
        grouped::group_epilogue_by_ops(y, row_group, epilogue)
    }

    /// The experts of each token, `[T, k]` i32-or-wider Int, best first (ties to the lower
    /// expert), from scores `[T, E]` (`ops::token_routing`). The default runs k rounds of
    /// argmax; CubeBackend one kernel.
    fn lowp_top_k(scores: FloatTensor<Self>, k: usize) -> Result<IntTensor<Self>> {
        crate::ops::token_routing::top_k_reference::<Self>(scores, k)
    }

    /// The stable sort of `n` assignments by expert (`expert [n]`): the experts' counts `[E]`
    /// and each assignment's packed position `[n]` (`ops::token_routing`). The default is a
    /// counting sort in tensor ops; CubeBackend three kernels.
    fn lowp_expert_positions(
        expert: IntTensor<Self>,
        experts: usize,
    ) -> Result<(IntTensor<Self>, IntTensor<Self>)> {
        crate::ops::token_routing::expert_positions_reference::<Self>(expert, experts)
    }

    /// The rows of the assignments at `position [T·k]` in `layout`, and the inverse maps.
    fn lowp_route_rows(
        position: IntTensor<Self>,
        layout: &GroupLayout<Self>,
        k: usize,
    ) -> Result<crate::backend::routing::TokenRoutes<Self>> {
        crate::ops::token_routing::route_rows_reference::<Self>(position, layout, k)
    }

    /// Each token's k rows of the aligned `y [rows, cols]`, weighted by f32 `weights [T, k]`
    /// (summed when `None`) in f32: `[T, cols]` in y's dtype.
    fn lowp_combine_rows(
        y: FloatTensor<Self>,
        weights: Option<FloatTensor<Self>>,
        routes: &crate::backend::routing::TokenRoutes<Self>,
    ) -> Result<FloatTensor<Self>> {
        crate::ops::token_routing::combine_rows_reference::<Self>(y, weights, routes)
    }

    /// The gradient of `lowp_combine_rows` with respect to y: `[rows, cols]` in dout's dtype.
    fn lowp_combine_rows_backward(
        dout: FloatTensor<Self>,
        weights: Option<FloatTensor<Self>>,
        routes: &crate::backend::routing::TokenRoutes<Self>,
    ) -> Result<FloatTensor<Self>> {
        crate::ops::token_routing::combine_rows_backward_reference::<Self>(dout, weights, routes)
    }

    /// The gradient of `lowp_combine_rows` with respect to its weights: f32 `[T, k]`.
    fn lowp_combine_weights_grad(
        dout: FloatTensor<Self>,
        y: FloatTensor<Self>,
        routes: &crate::backend::routing::TokenRoutes<Self>,
    ) -> Result<FloatTensor<Self>> {
        crate::ops::token_routing::combine_weights_grad_reference::<Self>(dout, y, routes)
    }

    /// Uploads a host matrix as a `[rows, cols]` float tensor of the matrix's own dtype where the
    /// backend can hold it (NdArray holds f32 only).
    fn float_from_host(m: &HostMatrix, device: &Self::Device) -> FloatTensor<Self>;

    /// Device bytes holding f32 values, as a float tensor of `shape` (no copy where the backend
    /// can share the buffer; used to hand a recorded amax to tensor code without a host sync).
    fn float_from_bytes(bytes: &Self::Bytes, shape: [usize; 2]) -> FloatTensor<Self>;

    /// One of a linear layer's GEMMs on quantized operands, each read from the representation
    /// its kind needs (see `GemmKind`). The default dequantizes to f32 and uses the backend's
    /// matmul; CUDA overrides it with cuBLASLt.
    fn lowp_gemm(
        kind: GemmKind,
        a: &QuantizedTensor<Self>,
        b: &QuantizedTensor<Self>,
        options: GemmOptions<Self>,
    ) -> Result<FloatTensor<Self>> {
        gemm::dequantize_matmul(kind, a, b, burn::tensor::FloatDType::F32, options)
    }

    /// GEMMs that run together, such as a layer's dgrad and wgrad (they read the same inputs and
    /// nothing between them depends on the other): the outputs in order. The default runs them one
    /// by one; CUDA orders the whole group against CubeCL's stream with one handshake and spreads
    /// the GEMMs over its streams.
    fn lowp_gemm_group(calls: Vec<GemmCall<'_, Self>>) -> Result<Vec<FloatTensor<Self>>> {
        calls
            .into_iter()
            .map(|c| Self::lowp_gemm(c.kind, c.a, c.b, c.options))
            .collect()
    }

    /// FP8 current scaling of `x` with its amax already taken by the producer of `x` (f32 bits
    /// on the device, e.g. from `lowp_norm_forward`): the quantize skips its amax pass. The
    /// default quantizes as `lowp_quantize` (the amax is the same by construction).
    fn quantize_fp8_current_with_amax(
        x: FloatTensor<Self>,
        config: &FormatConfig,
        _amax: &Self::Bytes,
        usage: Usage,
    ) -> Result<QuantizedTensor<Self>> {
        Self::lowp_quantize(x, config, usage, false)
    }

    /// LayerNorm / RMSNorm of the rows of `x [rows, cols]` with `gamma` (and `beta`) `[cols]`
    /// in x's dtype (`norm_act`). With `want_amax`, backends that can take the amax of `y` in
    /// the same pass return it.
    fn lowp_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: Option<FloatTensor<Self>>,
        spec: &NormSpec,
        _want_amax: bool,
    ) -> Result<NormForward<FloatTensor<Self>, Self::Bytes>> {
        let r = norm_act::norm_forward_reference::<Self>(x, gamma, beta, spec);
        Ok(NormForward {
            y: r.y,
            mean: r.mean,
            rstd: r.rstd,
            amax: None,
        })
    }

    /// The norm's backward: dx, and f32 dγ and (LayerNorm with `beta`) dβ.
    #[allow(clippy::too_many_arguments)]
    fn lowp_norm_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        spec: &NormSpec,
        beta: bool,
    ) -> Result<NormBackward<FloatTensor<Self>>> {
        Ok(norm_act::norm_backward_reference::<Self>(
            dy, x, gamma, mean, rstd, spec, beta,
        ))
    }

    /// The activation of `h [rows, F']`, `[rows, F]` (`F' = 2F` when gated); its amax when
    /// `want_amax` and the backend fuses it.
    fn lowp_activation_forward(
        h: FloatTensor<Self>,
        spec: &crate::backend::activation::ActivationSpec,
        _want_amax: bool,
    ) -> Result<ActivationOutput<FloatTensor<Self>, Self::Bytes>> {
        Ok(ActivationOutput {
            y: norm_act::activation_forward_reference::<Self>(h, spec),
            amax: None,
            dbias: None,
        })
    }

    /// A LayerNormMLP's fc2 input under FP8 delayed scaling in one pass where the backend fuses
    /// it: the activation of `h [rows, F']` quantized with the given scale as
    /// `quantize_fp8_with_scale` does (recording the amax into `record` where
    /// `delayed_amax_in_place`), in the representations of `usage`, bit for bit
    /// `lowp_activation_forward` followed by `quantize_fp8_with_scale` on its output, without that
    /// output in memory. `None` where the backend has no such kernel: the caller runs the two.
    /// The default has none.
    fn lowp_activation_quantize_fp8_with_scale(
        _h: FloatTensor<Self>,
        _spec: &crate::backend::activation::ActivationSpec,
        _fp8: Fp8Format,
        _scale: ScaleColumns<Self>,
        _usage: Usage,
        _record: Option<AmaxHistoryColumns<Self>>,
    ) -> Result<Option<QuantizedTensor<Self>>> {
        Ok(None)
    }

    /// A LayerNormMLP's fc2 input under FP8 current scaling (`config`, a
    /// `FormatConfig::Fp8Current`) without the activation's output in memory, where the backend
    /// fuses it: an amax pass over the activation of `h`, then the cast applying the activation
    /// itself; bit for bit `lowp_activation_forward` (with its amax) followed by
    /// `quantize_fp8_current_with_amax`. `None` where the backend has no such kernels: the caller
    /// runs the two. The default has none.
    fn lowp_activation_quantize_fp8_current(
        _h: FloatTensor<Self>,
        _spec: &crate::backend::activation::ActivationSpec,
        _config: &FormatConfig,
        _usage: Usage,
    ) -> Result<Option<QuantizedTensor<Self>>> {
        Ok(None)
    }

    /// A Linear's bias gradient `Σ_rows dy` of `dy [rows, cols]` (`[cols]`, in dy's dtype or
    /// f32; the caller casts it to the bias's dtype) and, where fused, `max |dy|` from the same
    /// read (f32 bits), which FP8 current scaling of dY then uses instead of its own amax pass
    /// (`OperandQuantizer::quantize_with_amax`). The default sums with Burn ops and takes no amax.
    fn lowp_dbias_amax(dy: FloatTensor<Self>) -> Result<(FloatTensor<Self>, Option<Self::Bytes>)> {
        Ok((crate::ops::row_broadcast::column_sum::<Self>(dy), None))
    }

    /// The activation's backward: `dh [rows, F']` from `dy [rows, F]` and `h`; its amax when
    /// `want_amax` and fused; the f32 bias gradient `Σ_rows dh` when `want_dbias`.
    fn lowp_activation_backward(
        dy: FloatTensor<Self>,
        h: FloatTensor<Self>,
        spec: &crate::backend::activation::ActivationSpec,
        _want_amax: bool,
        want_dbias: bool,
    ) -> Result<ActivationOutput<FloatTensor<Self>, Self::Bytes>> {
        let r = norm_act::activation_backward_reference::<Self>(dy, h, spec, want_dbias);
        Ok(ActivationOutput {
            y: r.y,
            amax: None,
            dbias: r.dbias,
        })
    }

    /// Partial statistics of `x` (viewed as `[rows, cols]`) for the debug tools: f32
    /// `[records, STAT_FIELDS]` bytes, one record per 128x2048 block (`debug::stats`). With
    /// `error = (dequantized, limit)` (an f32 copy of `x` after quantization, same shape, and the
    /// f32 overflow limit: one element, or one per group with `labels`) the quantization terms
    /// too. With `labels` (`row_group`: the Int group of each row, `count` or more for rows to
    /// leave out) the records name their group, so
    /// every group of a grouped tensor is measured by one launch. One read of `x` on device
    /// backends; this default computes the reference on the host (NdArray; a device backend falls
    /// back to it for odd `cols`).
    fn lowp_tensor_stats(
        x: FloatTensor<Self>,
        error: Option<(FloatTensor<Self>, FloatTensor<Self>)>,
        labels: Option<(IntTensor<Self>, usize)>,
    ) -> Result<Self::Bytes> {
        tensor_stats_on_host::<Self>(x, error, labels)
    }

    /// `lowp_tensor_stats` of `x` against `q`'s copies in `directions` (one or both) in one pass
    /// that decodes the copies itself, with no dequantized copy written: one set of records per
    /// direction, in the order asked, each equal bit for bit to
    /// `lowp_tensor_stats(x, Some((dequantized, limit)), labels)`, where the dequantized copy is
    /// `lowp_dequantize` (or `lowp_grouped_dequantize` with `grouped`: the tensor's groups and
    /// the Int group of each row of `x`) and the limit is the debug tools' overflow limit:
    /// `fp8_max · scale_inv` for FP8 per-tensor copies (per group when grouped), none (+inf) for
    /// block scales. `x` is `[rows, q.cols]` with `rows <= q.rows` (a token tensor may leave out
    /// its padding rows). `None` where this backend or `q`'s format has no such pass (the caller
    /// dequantizes): CubeCL backends decode FP8 per-tensor and block copies.
    fn lowp_quantization_stats(
        x: FloatTensor<Self>,
        q: &QuantizedTensor<Self>,
        directions: &[Direction],
        grouped: Option<(&Groups<Self>, IntTensor<Self>)>,
    ) -> Result<Option<Vec<Self::Bytes>>> {
        let _ = (x, q, directions, grouped);
        Ok(None)
    }

    /// The logical f32 `[rows, cols]` of every group of a grouped quantized tensor
    /// (`format::grouped`); rows that hold no token (label `groups.count` in `row_group`) are
    /// unspecified (statistics leave them out). The
    /// default dequantizes group by group on the host's copy of the groups (free on NdArray; on a
    /// device backend it waits for the split sizes); CubeCL backends run FP8 per-tensor and block
    /// formats as one kernel that reads the groups on the device.
    fn lowp_grouped_dequantize(
        q: &QuantizedTensor<Self>,
        direction: Direction,
        groups: &Groups<Self>,
        row_group: &IntTensor<Self>,
    ) -> Result<FloatTensor<Self>> {
        let _ = row_group;
        grouped::dequantize_group_by_group::<Self>(q, direction, groups)
    }

    /// One AdamW step of a parameter with Burn's gradient-norm clipping (`optim::FusedAdamW`):
    /// the parameter in its dtype and the f32 moments, all flat `[n]`. The default runs Burn's
    /// sequence of tensor ops (`optim::adamw::adamw_step_reference`); CubeCL backends run one
    /// kernel (plus the sum of squares when clipping).
    fn lowp_adamw_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<(FloatTensor<Self>, FloatTensor<Self>)>,
        step: &crate::backend::optim::AdamWStep,
    ) -> crate::backend::optim::AdamWTensors<FloatTensor<Self>> {
        crate::optim::adamw::adamw_step_reference::<Self>(param, grad, moments, step)
    }

    /// Rotary position embedding of `x [rows, head]` with Burn's `freq_complex [max_seq, head, 2]`
    /// (`ops/rope_op.rs`); `inverse` gives its gradient. The default runs the formula with Burn
    /// ops in f32; CubeCL backends run one kernel.
    fn lowp_rope(
        x: FloatTensor<Self>,
        freq: FloatTensor<Self>,
        positions: crate::backend::attention::RopePositions,
        inverse: bool,
    ) -> Result<FloatTensor<Self>> {
        crate::ops::rope_op::rope_reference::<Self>(x, freq, positions, inverse)
    }

    /// Attention's head split (`ops/attention_op.rs`): the parts of token rows `x [batch · seq,
    /// parts · heads · head]` as `[batch · heads, seq, head]` tensors, the first
    /// `layout.rope_parts` rotated with `freq` (Burn's `freq_complex`). The default runs Burn's
    /// reshape, swap and narrow and `lowp_rope`; CubeCL backends one kernel (`kernels::heads`).
    fn lowp_split_heads(
        x: FloatTensor<Self>,
        freq: Option<FloatTensor<Self>>,
        layout: crate::backend::attention::HeadLayout,
    ) -> Result<Vec<FloatTensor<Self>>> {
        crate::ops::attention_op::split_heads_reference::<Self>(x, freq, layout)
    }

    /// `lowp_split_heads` transposed: the parts back into token rows, the first
    /// `layout.rope_parts` through RoPE's gradient.
    fn lowp_merge_heads(
        parts: Vec<FloatTensor<Self>>,
        freq: Option<FloatTensor<Self>>,
        layout: crate::backend::attention::HeadLayout,
    ) -> Result<FloatTensor<Self>> {
        crate::ops::attention_op::merge_heads_reference::<Self>(parts, freq, layout)
    }

    /// Attention's causal softmax of `scale · x` for scores `x [rows, seq]`, whole `[seq, seq]`
    /// blocks of query rows (`ops/softmax_op.rs`). The default runs the formula with Burn ops in
    /// f32; CubeCL backends run one kernel.
    fn lowp_causal_softmax(x: FloatTensor<Self>, scale: f32) -> Result<FloatTensor<Self>> {
        crate::ops::softmax_op::causal_softmax_reference::<Self>(x, scale)
    }

    /// The gradient of `lowp_causal_softmax` with respect to its scores, from its output `p` and
    /// the output's gradient `dp`: `scale · p · (dp - Σ p · dp)` per row.
    fn lowp_causal_softmax_backward(
        p: FloatTensor<Self>,
        dp: FloatTensor<Self>,
        scale: f32,
    ) -> Result<FloatTensor<Self>> {
        crate::ops::softmax_op::causal_softmax_backward_reference::<Self>(p, dp, scale)
    }

    /// `op(a) · op(b)` for `a`, `b` `[batch, rows, cols]` of one float dtype, `t` saying which
    /// enter transposed (`ops/batched_matmul.rs`). The default is Burn's matmul; CUDA runs one
    /// strided-batch cuBLASLt call.
    fn lowp_batched_matmul(
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        t: crate::backend::gemm::Transposes,
    ) -> Result<FloatTensor<Self>> {
        crate::ops::batched_matmul::batched_matmul_reference::<Self>(a, b, t)
    }

    /// The path `lowp_gemm` takes for these operands.
    fn gemm_path(
        _kind: GemmKind,
        _a: &QuantizedTensor<Self>,
        _b: &QuantizedTensor<Self>,
    ) -> GemmPath {
        GemmPath::DequantizeMatmul
    }
}

/// `LowpBackend::lowp_tensor_stats` computed on the host (reads the tensors).
pub fn tensor_stats_on_host<B: LowpBackend>(
    x: FloatTensor<B>,
    error: Option<(FloatTensor<B>, FloatTensor<B>)>,
    labels: Option<(IntTensor<B>, usize)>,
) -> Result<B::Bytes> {
    use burn::tensor::{FloatDType, TensorMetadata};
    let device = B::float_device(&x);
    let (rows, cols) = matrix_dims(x.shape().as_slice());
    let read = |t: FloatTensor<B>| -> Result<Vec<f32>> {
        burn::tensor::read_sync(B::float_into_data(B::float_cast(t, FloatDType::F32)))
            .map_err(|e| crate::error::LowpError::invalid("tensor read", "failed", format!("{e:?}")))?
            .to_vec::<f32>()
            .map_err(|e| crate::error::LowpError::invalid("tensor read", "f32", format!("{e:?}")))
    };
    let values = read(x)?;
    let error = match error {
        Some((dq, limit)) => Some((read(dq)?, read(limit)?)),
        None => None,
    };
    let labels = match labels {
        Some((row_group, count)) => {
            let data = burn::tensor::read_sync(B::int_into_data(row_group))
                .map_err(|e| crate::error::LowpError::invalid("row labels read", "failed", format!("{e:?}")))?;
            let row_group: Vec<u32> = data
                .convert::<i64>()
                .to_vec::<i64>()
                .map_err(|e| crate::error::LowpError::invalid("row labels", "i64", format!("{e:?}")))?
                .into_iter()
                .map(|g| g.clamp(0, count as i64) as u32)
                .collect();
            Some((row_group, count))
        }
        None => None,
    };
    let tiles = crate::debug::stats::tile_partials(
        &values,
        rows,
        cols,
        error.as_ref().map(|(dq, limit)| (dq.as_slice(), limit.as_slice())),
        labels.as_ref().map(|(row_group, count)| crate::debug::stats::RowLabels {
            row_group,
            count: *count,
        }),
    );
    let partials = crate::debug::stats::record_partials(&tiles, rows, cols);
    let bytes = partials.iter().flat_map(|v| v.to_le_bytes()).collect();
    Ok(B::bytes_from_host(bytes, &device))
}

/// The `FloatDType` of a float tensor's dtype (f32 for anything but f16 and bf16).
pub(crate) fn float_dtype(dtype: burn::tensor::DType) -> burn::tensor::FloatDType {
    use burn::tensor::{DType, FloatDType};
    match dtype {
        DType::BF16 => FloatDType::BF16,
        DType::F16 => FloatDType::F16,
        _ => FloatDType::F32,
    }
}

/// The 2D view `[prod(shape[..-1]), shape[-1]]` of a tensor shape.
pub(crate) fn matrix_dims(shape: &[usize]) -> (usize, usize) {
    let cols = shape.last().copied().unwrap_or(1);
    let rows = shape[..shape.len().saturating_sub(1)].iter().product();
    (rows, cols)
}
