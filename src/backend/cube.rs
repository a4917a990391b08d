//! `LowpBackend` for `CubeBackend<R, ..>`: the CubeCL kernels of `burn-lowp-kernels`, on CUDA or
//! wgpu. Inputs are read as raw words of their own dtype (f32, f16 or bf16).

use burn::tensor::ops::{FloatTensor, FloatTensorOps, IntTensor, IntTensorOps};
use burn::tensor::{DType, IntDType, Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_lowp_kernels as kernels;
use burn_lowp_kernels::cubecl::prelude::*;
use burn_lowp_kernels::cubecl::device::{Device, DeviceId, DeviceService, ServerUtilitiesHandle};
use burn_lowp_kernels::cubecl::device_handle::DeviceHandle;
use burn_lowp_kernels::cubecl::server::Handle;
use std::sync::{Arc, Mutex};
use kernels::scale::ScaleRule;
use kernels::{
    DirectionOutput, Directions, ElemKind, Fp8Kind, InputMatrix, KernelError, QuantizeOutput,
    RowGroups,
};

use super::grouped::{
    aligned_rows, GroupLayout, GroupedGemmPath, GroupedOperand, Groups, HostCopy, HostGroups,
    RowGroup, GROUP_ALIGN,
};
use super::{matrix_dims, LowpBackend};
use crate::error::{LowpError, Result};
use crate::format::grouped::{GroupScaling, SplitStatus};
use crate::format::fp8_block::BlockShape;
use crate::format::random::{stream_key, COLUMNWISE_STREAM, ROWWISE_STREAM};
use crate::format::{
    check_shape, codes_shape, scales_shape, Direction, FormatConfig, Fp8Format, HostMatrix,
    InputDtype, QuantFormat, ScaleLayout, Usage,
};
use crate::backend::quantized::{QuantizedStorage, QuantizedTensor, Storage, StorageScales};

/// A device byte buffer: a CubeCL handle and its length in bytes.
#[derive(Clone)]
pub struct CubeBytes<R: CubeRuntime> {
    pub client: ComputeClient<R>,
    pub device: R::Device,
    pub handle: Handle,
    pub len: usize,
}

impl<R: CubeRuntime> std::fmt::Debug for CubeBytes<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CubeBytes({} bytes)", self.len)
    }
}

pub(super) fn fp8_kind(fp8: Fp8Format) -> Fp8Kind {
    match fp8 {
        Fp8Format::E4M3 => Fp8Kind::E4M3,
        Fp8Format::E5M2 => Fp8Kind::E5M2,
    }
}

/// An FP8 storage's format, how its scales apply and its f32 scales, as the FP8 dequantize and
/// decoding statistics kernels read them (per-tensor `scale_inv` or block scales); `None` for
/// the other formats.
fn fp8_scaled<B: LowpBackend>(storage: &QuantizedStorage<B>) -> Option<(Fp8Format, kernels::Fp8Scales, &B::Bytes)> {
    match (&storage.format, &storage.scales) {
        (QuantFormat::Fp8Tensor { fp8 }, StorageScales::TensorScaleInv(s)) => Some((*fp8, kernels::Fp8Scales::Tensor, s)),
        (QuantFormat::Fp8Block { fp8, block }, StorageScales::BlockF32 { bytes, .. }) => {
            let kind = match block {
                BlockShape::OneByOneTwentyEight => kernels::Fp8Scales::Block1x128,
                BlockShape::OneTwentyEightSquare => kernels::Fp8Scales::Block128x128,
            };
            Some((*fp8, kind, bytes))
        }
        _ => None,
    }
}

/// The row-index type of an Int tensor the row kernels read (`row_gather`, `group_epilogue`).
fn index_kind(dtype: DType) -> Option<kernels::row_gather::IndexKind> {
    match dtype {
        DType::I32 => Some(kernels::row_gather::IndexKind::I32),
        DType::I64 => Some(kernels::row_gather::IndexKind::I64),
        _ => None,
    }
}

pub(super) fn elem_kind(dtype: DType, tensor: &str) -> Result<ElemKind> {
    match dtype {
        DType::F32 => Ok(ElemKind::F32),
        DType::F16 => Ok(ElemKind::F16),
        DType::BF16 => Ok(ElemKind::BF16),
        other => Err(LowpError::Dtype {
            tensor: tensor.to_string(),
            dtype: format!("{other:?}"),
            supported: "quantize kernels read F32, F16 and BF16".to_string(),
        }),
    }
}

pub(super) fn kernel_error(tensor: &str) -> impl Fn(KernelError) -> LowpError + '_ {
    move |e| LowpError::shape(tensor, e.value, e.rule)
}

/// The device scale rule of FP8 current scaling (a scale `fp8_max / amax` that overflows becomes
/// the largest f32, as TE's per-tensor current scaling).
fn current_scaling_rule(c: &crate::format::Fp8CurrentScaling) -> ScaleRule {
    ScaleRule {
        fp8: fp8_kind(c.fp8),
        pow2: c.pow2_scales,
        epsilon_bits: c.amax_epsilon.to_bits(),
        value_for_inf_bits: f32::MAX.to_bits(),
    }
}

/// Grouped kernels take matrices whose groups fill whole 128-row chunks.
fn check_grouped_rows<R: CubeRuntime>(rows: usize, groups: &Groups<impl LowpBackend<Bytes = CubeBytes<R>>>) -> Result<()> {
    if rows != groups.rows || rows % GROUP_ALIGN != 0 {
        return Err(LowpError::shape(
            "grouped input",
            format!("M = {rows}"),
            format!("equals the rows of its groups ({}), a multiple of {GROUP_ALIGN}", groups.rows),
        ));
    }
    Ok(())
}

/// A contiguous tensor whose data starts 16-byte aligned (the kernels load 16-byte vectors).
/// Row labels as a contiguous i32 tensor (the stats and grouped dequantize kernels read i32).
fn i32_labels<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    t: IntTensor<CubeBackend<R, F, I, BT>>,
) -> CubeTensor<R> {
    let t = if t.dtype == DType::I32 {
        t
    } else {
        CubeBackend::<R, F, I, BT>::int_cast(t, IntDType::I32)
    };
    // (Labels are whole tensors, never views at an offset.)
    into_contiguous(t)
}

pub(super) fn prepare<R: CubeRuntime>(x: CubeTensor<R>) -> CubeTensor<R> {
    let x = into_contiguous(x);
    if x.handle.offset_start.unwrap_or(0) % 16 == 0 {
        x
    } else {
        // A view into a larger buffer at an unaligned offset: copy it (x * 1 is exact).
        let copy = CubeBackend::<R, f32, i32, u32>::float_mul_scalar(x, 1.0f32.into());
        into_contiguous(copy)
    }
}

pub(super) fn bytes<R: CubeRuntime>(
    client: &ComputeClient<R>,
    device: &R::Device,
    handle: Handle,
    len: usize,
) -> CubeBytes<R> {
    CubeBytes {
        device: device.clone(),
        client: client.clone(),
        handle,
        len,
    }
}

/// Wraps kernel outputs in a `QuantizedTensor`, with shapes from the format's layout rules.
/// `groups` is the number of per-tensor values (FP8 scale_inv, amaxes): 1, or one per group.
pub(super) fn wrap<R: CubeRuntime, B: LowpBackend<Bytes = CubeBytes<R>>>(
    client: &ComputeClient<R>,
    device: &R::Device,
    out: QuantizeOutput,
    format: QuantFormat,
    (rows, cols): (usize, usize),
    swizzled: bool,
    groups: usize,
) -> QuantizedTensor<B> {
    let storage = |side: Option<DirectionOutput>, direction: Direction| {
        side.map(|d| {
            let cshape = codes_shape(&format, rows, cols, direction);
            let sshape = scales_shape(&format, rows, cols, direction);
            let scales = match format {
                QuantFormat::Fp8Tensor { .. } => {
                    StorageScales::TensorScaleInv(bytes(client, device, d.scales, 4 * groups))
                }
                QuantFormat::Fp8Block { .. } => StorageScales::BlockF32 {
                    shape: sshape,
                    bytes: bytes(client, device, d.scales, sshape[0] * sshape[1] * 4),
                },
                QuantFormat::Mxfp8 { .. } | QuantFormat::Nvfp4 { .. } => {
                    StorageScales::BlockBytes {
                        shape: sshape,
                        bytes: bytes(client, device, d.scales, sshape[0] * sshape[1]),
                        layout: if swizzled {
                            ScaleLayout::Swizzled
                        } else {
                            ScaleLayout::Compact
                        },
                    }
                }
            };
            Storage::Quantized(QuantizedStorage {
                format,
                codes: bytes(client, device, d.codes, cshape[0] * cshape[1]),
                codes_shape: cshape,
                scales,
                amax: d.amax.map(|a| bytes(client, device, a, 4 * groups)),
                shared_scale: false,
            })
        })
    };
    QuantizedTensor {
        rows,
        cols,
        rowwise: storage(out.rowwise, Direction::Rowwise),
        columnwise: storage(out.columnwise, Direction::Columnwise),
    }
}

fn float_tensor<R: CubeRuntime>(
    client: &ComputeClient<R>,
    device: &R::Device,
    handle: Handle,
    rows: usize,
    cols: usize,
) -> CubeTensor<R> {
    CubeTensor::new_contiguous(
        client.clone(),
        device.clone(),
        Shape::new([rows, cols]),
        handle,
        DType::F32,
    )
}

/// Applies `f` to the block-scale bytes of each storage, producing `target`.
fn relayout<R: CubeRuntime, B: LowpBackend<Bytes = CubeBytes<R>>>(
    mut q: QuantizedTensor<B>,
    target: ScaleLayout,
    f: impl Fn(
        &ComputeClient<R>,
        &Handle,
        usize,
        usize,
        bool,
    ) -> std::result::Result<Handle, KernelError>,
) -> Result<QuantizedTensor<B>> {
    for (storage, direction) in [
        (q.rowwise.as_mut(), Direction::Rowwise),
        (q.columnwise.as_mut(), Direction::Columnwise),
    ] {
        let Some(Storage::Quantized(storage)) = storage else {
            continue;
        };
        // The GEMM reads MXFP8 columnwise scales [M/32, K] as their transpose.
        let transposed = match storage.format {
            QuantFormat::Mxfp8 { .. } => direction == Direction::Columnwise,
            QuantFormat::Nvfp4 { .. } => false,
            other => {
                return Err(LowpError::invalid(
                    "scale layout",
                    format!("{target:?}"),
                    format!(
                        "only MXFP8 and NVFP4 have swizzled block scales, not {}",
                        other.name()
                    ),
                ))
            }
        };
        if let StorageScales::BlockBytes {
            shape,
            bytes,
            layout,
        } = &mut storage.scales
        {
            if *layout == target {
                continue;
            }
            let [r, c] = if transposed {
                [shape[1], shape[0]]
            } else {
                *shape
            };
            bytes.handle = f(&bytes.client, &bytes.handle, r, c, transposed)
                .map_err(kernel_error("scales"))?;
            *layout = target;
        }
    }
    Ok(q)
}

/// NVFP4 kernel options; with `groups`, group g's stochastic rounding is seeded `seed + g`.
fn nvfp4_options(c: &crate::format::Nvfp4Config, groups: usize) -> kernels::Nvfp4Options {
    kernels::Nvfp4Options {
        block_2d: c.block_2d,
        rht: c.rht,
        stochastic_keys: c.stochastic_seed.map(|s| {
            (0..groups as u64)
                .map(|g| {
                    let seed = s.wrapping_add(g);
                    (
                        stream_key(seed, ROWWISE_STREAM),
                        stream_key(seed, COLUMNWISE_STREAM),
                    )
                })
                .collect()
        }),
    }
}

/// A host read in flight: the bytes, once the copies are done.
type PendingRead = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = std::result::Result<
                    Vec<burn_lowp_kernels::cubecl::bytes::Bytes>,
                    burn_lowp_kernels::cubecl::server::ServerError,
                >,
            > + Send,
    >,
>;

/// Starts reading `handles` into pinned host memory (CubeCL queues the copies on the stream now)
/// and returns the future that waits for them.
fn read_later<R: CubeRuntime>(client: &ComputeClient<R>, handles: Vec<Handle>) -> PendingRead {
    let future = Box::pin(client.read_async(handles));
    // SAFETY: cubecl-runtime 0.10's `read_async` returns `self.do_read(..)`, a boxed `'static`
    // future that owns what it reads (the copies are queued before it returns); the `'_` in its
    // signature is only edition 2024's capture of `&self`. The client it came from is an `Arc`
    // handle that outlives the future wherever it is kept (`bytes_to_host_later` keeps a clone).
    unsafe { std::mem::transmute(future as std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send + '_>>) }
}

/// A device-to-host read whose copies CubeCL's device thread queues when it reaches the request
/// in its task queue. `ComputeClient::read_async` itself is a blocking round trip: it flushes
/// the queue and waits for the device thread to launch everything before it (16 times per MoE
/// step, one per layer and micro-batch, for the grouped GEMMs' splits). Submitted as a task, the
/// request costs the training thread nothing; the copies still follow their producers on the
/// stream.
struct HostRead {
    future: Arc<Mutex<Option<PendingRead>>>,
    queue: DeviceHandle<DeviceTasks>,
    /// On CUDA, when asked for: a mark after the copies, to tell they have arrived without
    /// waiting (`cublaslt::StreamMark`), set when the device thread queues them.
    #[cfg(feature = "cuda")]
    mark: Option<Arc<Mutex<Option<super::cublaslt::StreamMark>>>>,
    /// Off CUDA, a read dropped unawaited is completed first: cubecl-wgpu 0.10 hands the
    /// staging buffer of a dropped read back to its pool while it is still mapped, and the next
    /// read that takes it fails wgpu's validation ("buffer still mapped"). A `GroupLayout`
    /// dropped before anyone read its splits did that.
    complete_on_drop: bool,
    /// `future` took the read (nothing left to complete).
    taken: bool,
}

impl Drop for HostRead {
    fn drop(&mut self) {
        if !self.complete_on_drop || self.taken {
            return;
        }
        // The device thread may not have queued the read yet: wait until it has.
        let _ = self.queue.submit_blocking(|_| ());
        if let Some(pending) = self.future.lock().expect("host read slot").take() {
            let _ = burn_lowp_kernels::cubecl::future::block_on(pending);
        }
    }
}


/// Our own tasks on CubeCL's device thread of a device (host reads here, cuBLASLt GEMM groups in
/// `cublaslt.rs`): they run on that thread in order with CubeCL's own (one queue per device and
/// stage), but borrow only this empty state. A task submitted for CubeCL's server would hold the
/// server's state while it runs, and the CubeCL calls such a task makes (the GEMM handshake's
/// flag kernels and `get_resource`, `read_async`), which run inline on that thread, borrow it
/// again: the first such task panicked with the state already borrowed.
pub(crate) struct DeviceTasks;

impl DeviceService for DeviceTasks {
    fn init(_device: DeviceId) -> Self {
        DeviceTasks
    }

    fn utilities(&self) -> ServerUtilitiesHandle {
        Arc::new(())
    }
}

impl HostRead {
    /// `marked`: also queue a `StreamMark` after the copies (on CUDA; ignored elsewhere).
    fn request<R: CubeRuntime>(
        client: ComputeClient<R>,
        device: &R::Device,
        handles: Vec<Handle>,
        marked: bool,
    ) -> Self {
        let future = Arc::new(Mutex::new(None));
        let slot = future.clone();
        let queue = DeviceHandle::<DeviceTasks>::new(device.to_id());
        // (The mark's slot, and the CUDA device it is made on.)
        #[cfg(feature = "cuda")]
        let mark = (marked && super::cuda_gemm::is_cuda::<R>())
            .then(|| (Arc::new(Mutex::new(None)), super::cuda_gemm::cuda_device::<R>(device)));
        #[cfg(not(feature = "cuda"))]
        let _ = marked;
        // Under `DeviceFlags` the mark is made in the read's task (it launches CubeCL kernels);
        // under `CubeclStream` by a task of CubeCL's server queued right behind it.
        #[cfg(feature = "cuda")]
        let ordering = super::cublaslt::stream_ordering();
        #[cfg(feature = "cuda")]
        let task_mark = mark
            .clone()
            .filter(|_| ordering == super::cublaslt::StreamOrdering::DeviceFlags);
        // On the device thread, `read_async`'s own blocking call runs inline.
        queue.submit(move |_| {
            *slot.lock().expect("host read slot") = Some(read_later(&client, handles));
            #[cfg(feature = "cuda")]
            if let Some((mark, device)) = task_mark {
                let cuda = super::cuda_gemm::cuda_client(&client);
                *mark.lock().expect("host read mark") = super::cublaslt::mark_cubecl_stream(cuda, device);
            }
        });
        #[cfg(feature = "cuda")]
        if let Some((mark, device)) = &mark {
            if ordering == super::cublaslt::StreamOrdering::CubeclStream {
                super::cublaslt::queue_stream_mark(*device, mark.clone());
            }
        }
        #[cfg(feature = "cuda")]
        let complete_on_drop = !super::cuda_gemm::is_cuda::<R>();
        #[cfg(not(feature = "cuda"))]
        let complete_on_drop = true;
        HostRead {
            future,
            queue,
            #[cfg(feature = "cuda")]
            mark: mark.map(|(mark, _)| mark),
            complete_on_drop,
            taken: false,
        }
    }

    /// Whether the copies have arrived, without waiting (`None` where no mark was asked for):
    /// false until the device thread has queued them, and where no mark could be made.
    fn arrived(&self) -> Option<super::host_copy::Arrived> {
        #[cfg(feature = "cuda")]
        if let Some(mark) = self.mark.clone() {
            return Some(Box::new(move || {
                mark.lock().expect("host read mark").as_ref().is_some_and(|m| m.reached())
            }));
        }
        None
    }

    /// The read's future; waits for the device thread to reach the request if it has not yet.
    fn future(mut self) -> Result<PendingRead> {
        self.taken = true;
        if let Some(f) = self.future.lock().expect("host read slot").take() {
            return Ok(f);
        }
        self.queue
            .submit_blocking(|_| ())
            .map_err(|e| LowpError::invalid("device read", "request", format!("{e:?}")))?;
        self.future
            .lock()
            .expect("host read slot")
            .take()
            .ok_or_else(|| LowpError::invalid("device read", "request", "the device thread dropped it"))
    }
}

/// `LowpBackend::bytes_to_host_later`; `marked`: on CUDA also a probe that tells, without
/// waiting, whether the copies have arrived (`HostRead`'s mark).
fn host_read_later<R: CubeRuntime>(
    bytes: Vec<CubeBytes<R>>,
    marked: bool,
) -> (
    Box<dyn FnOnce() -> Result<Vec<Vec<u8>>> + Send>,
    Option<super::host_copy::Arrived>,
) {
    let Some(first) = bytes.first() else {
        return (Box::new(|| Ok(Vec::new())), None);
    };
    let client = first.client.clone();
    let lens: Vec<usize> = bytes.iter().map(|b| b.len).collect();
    let handles: Vec<Handle> = bytes.iter().map(|b| b.handle.clone()).collect();
    let pending = HostRead::request(client.clone(), &first.device, handles, marked);
    let arrived = pending.arrived();
    let wait = Box::new(move || {
        let data = burn_lowp_kernels::cubecl::future::block_on(pending.future()?)
            .map_err(|e| LowpError::invalid("device read", "failed", format!("{e:?}")))?;
        drop(client);
        Ok(data
            .into_iter()
            .zip(lens)
            .map(|(d, len)| d[..len].to_vec())
            .collect())
    });
    (wait, arrived)
}

/// The FP8 per-tensor cast of `act(h)` by `cast` (one of the activated-cast launchers), with the
/// checks they share: a gated input of even width, an output FP8 can block.
fn activated_fp8_cast<R: CubeRuntime, B: LowpBackend<Bytes = CubeBytes<R>>>(
    h: CubeTensor<R>,
    spec: &crate::backend::activation::ActivationSpec,
    fp8: Fp8Format,
    usage: Usage,
    cast: impl FnOnce(
        &ComputeClient<R>,
        InputMatrix,
        (kernels::fp8::Fp8Prologue, kernels::activation::ActivationParams),
        Directions,
    ) -> std::result::Result<kernels::QuantizeOutput, kernels::KernelError>,
) -> Result<Option<QuantizedTensor<B>>> {
    let (rows, h_cols) = matrix_dims(&h.shape().as_slice());
    let gated = spec.activation.is_gated();
    if gated && h_cols % 2 != 0 {
        return Err(LowpError::shape(
            "activation input",
            format!("[{rows}, {h_cols}]"),
            format!("{} takes two halves of one width", spec.activation),
        ));
    }
    let cols = if gated { h_cols / 2 } else { h_cols };
    let format = QuantFormat::Fp8Tensor { fp8 };
    check_shape("activation output", rows, cols, &format)?;
    let kind = elem_kind(h.dtype, "activation input")?;
    let h = prepare(h);
    let client = h.client.clone();
    let device = h.device.clone();
    let input = InputMatrix {
        handle: &h.handle,
        rows,
        cols: h_cols,
        kind,
    };
    let prologue = (
        kernels::fp8::Fp8Prologue {
            act: spec.activation.function(),
            gated,
            clamped_gate: spec.activation == crate::backend::activation::Activation::ClampedSwiglu,
        },
        spec.kernel_params(),
    );
    let directions = Directions {
        rowwise: usage.rowwise,
        columnwise: usage.columnwise,
    };
    let out = cast(&client, input, prologue, directions).map_err(kernel_error("activation input"))?;
    Ok(Some(wrap(&client, &device, out, format, (rows, cols), false, 1)))
}

/// `LowpBackend::lowp_quantize`; with `amax` (f32 bits on the device, taken by the tensor's
/// producer), FP8 current scaling skips its amax pass (`quantize_fp8_current_with_amax`); other
/// formats have no use for it.
fn quantize_plain<R: CubeRuntime, B: LowpBackend<Bytes = CubeBytes<R>>>(
    x: CubeTensor<R>,
    config: &FormatConfig,
    usage: Usage,
    optimize_for_gemm: bool,
    amax: Option<&CubeBytes<R>>,
) -> Result<QuantizedTensor<B>> {
    let (rows, cols) = matrix_dims(&x.shape().as_slice());
    let format = config.format();
    check_shape("input", rows, cols, &format)?;
    let kind = elem_kind(x.dtype, "input")?;
    let x = prepare(x);
    let client = x.client.clone();
    let device = x.device.clone();
    let input = InputMatrix {
        handle: &x.handle,
        rows,
        cols,
        kind,
    };
    let directions = Directions {
        rowwise: usage.rowwise,
        columnwise: usage.columnwise,
    };
    let swizzled =
        optimize_for_gemm && matches!(config, FormatConfig::Mxfp8(_) | FormatConfig::Nvfp4(_));
    let out = match config {
        FormatConfig::Fp8Current(c) => {
            let rule = current_scaling_rule(c);
            let scaling = match amax {
                Some(amax) => kernels::TensorScaling::CurrentFromAmax {
                    rule,
                    amax: &amax.handle,
                },
                None => kernels::TensorScaling::Current { rule },
            };
            kernels::quantize_fp8_tensor(&client, input, rule.fp8, scaling, directions, None, false)
        }
        FormatConfig::Fp8Block(c) => {
            let rule = ScaleRule {
                fp8: fp8_kind(c.fp8),
                pow2: c.pow2_scales,
                epsilon_bits: c.amax_epsilon.to_bits(),
                value_for_inf_bits: kind.max_finite_bits(),
            };
            kernels::quantize_fp8_block(
                &client,
                input,
                rule,
                c.block == BlockShape::OneTwentyEightSquare,
                directions,
                None,
            )
        }
        FormatConfig::Mxfp8(c) => kernels::quantize_mxfp8(
            &client,
            input,
            fp8_kind(c.fp8),
            c.block_2d,
            directions,
            swizzled,
        ),
        FormatConfig::Nvfp4(c) => {
            kernels::quantize_nvfp4(&client, input, &nvfp4_options(c, 1), directions, swizzled, None)
        }
    }
    .map_err(kernel_error("input"))?;
    Ok(wrap(&client, &device, out, format, (rows, cols), swizzled, 1))
}

/// Columns `first + g * stride` of a module's delayed-scaling state that a cast reads (the
/// scales) or writes (row 0 of the amax history) in place, checked, held as a tensor that
/// outlives the launch.
struct StateTarget<R: CubeRuntime> {
    tensor: CubeTensor<R>,
    first: usize,
    stride: usize,
}

impl<R: CubeRuntime> StateTarget<R> {
    /// The scales of `ScaleColumns`, checked, as a contiguous tensor (the module's scale state
    /// already is one: no copy).
    fn scales<F: FloatElement, I: IntElement, BT: BoolElement>(
        columns: super::ScaleColumns<CubeBackend<R, F, I, BT>>,
        count: usize,
    ) -> Result<Self> {
        columns.indices(count)?;
        Ok(StateTarget {
            tensor: into_contiguous(columns.scales),
            first: columns.first,
            stride: columns.stride,
        })
    }

    fn kernel_arg(&self) -> kernels::StateColumns<'_> {
        kernels::StateColumns {
            buffer: &self.tensor.handle,
            first: self.first,
            stride: self.stride,
        }
    }
}

/// The history row a delayed cast records into (`AmaxHistoryColumns`), checked: an f32
/// `[len, width]` tensor whose row 0 the cast writes where it lies (columns one word apart; the
/// rows may be pitched, as CubeCL lays out `zeros([1024, 3])`), so that the writes land in the
/// module's tensor and not in a copy, holding the `count` columns `first + g * stride`.
fn history_row<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    record: Option<super::AmaxHistoryColumns<CubeBackend<R, F, I, BT>>>,
    count: usize,
) -> Result<Option<StateTarget<R>>> {
    let Some(record) = record else {
        return Ok(None);
    };
    let history = record.history;
    let dims = history.shape().as_slice().to_vec();
    let strides = history.meta.strides().to_vec();
    let last = super::last_column(record.first, record.stride, count);
    let fits = dims.len() == 2 && last.is_some_and(|last| last < dims[1]);
    let row_in_place = strides.len() == 2 && strides[1] == 1 && strides[0] >= dims[1];
    if history.dtype != DType::F32 || !row_in_place || !fits {
        return Err(LowpError::shape(
            "amax history",
            format!(
                "{:?} {dims:?} strides {strides:?}, columns {} + g * {} for {count} groups",
                history.dtype, record.first, record.stride
            ),
            "an f32 [len, slots] history with unit column stride holding every recorded column",
        ));
    }
    Ok(Some(StateTarget {
        tensor: history,
        first: record.first,
        stride: record.stride,
    }))
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> LowpBackend
    for CubeBackend<R, F, I, BT>
{
    type Bytes = CubeBytes<R>;

    fn delayed_amax_in_place() -> bool {
        true
    }

    fn lowp_delayed_update(
        history: FloatTensor<Self>,
        scale: FloatTensor<Self>,
        numerator: f32,
        most_recent: bool,
    ) -> Result<(FloatTensor<Self>, FloatTensor<Self>)> {
        let dims = history.shape().as_slice().to_vec();
        let [len, width] = dims[..] else {
            return Err(LowpError::shape("amax history", format!("{dims:?}"), "[history_len, slots]"));
        };
        if history.dtype != DType::F32 || scale.dtype != DType::F32 || scale.shape().num_elements() != width {
            return Err(LowpError::shape(
                "delayed-scaling state",
                format!("history {:?} {dims:?}, scale {:?} {:?}", history.dtype, scale.dtype, scale.shape().as_slice()),
                "an f32 history [len, slots] and f32 scales [slots]",
            ));
        }
        let (history, scale) = (into_contiguous(history), into_contiguous(scale));
        let (client, device) = (history.client.clone(), history.device.clone());
        let (new_history, new_scale) = kernels::delayed_scaling::delayed_scaling_update(
            &client,
            &history.handle,
            &scale.handle,
            len,
            width,
            numerator,
            most_recent,
        );
        let f32_tensor = |handle, shape: Vec<usize>| {
            CubeTensor::new_contiguous(client.clone(), device.clone(), Shape::from(shape), handle, DType::F32)
        };
        Ok((f32_tensor(new_history, vec![len, width]), f32_tensor(new_scale, vec![width])))
    }

    fn lowp_quantize(
        x: FloatTensor<Self>,
        config: &FormatConfig,
        usage: Usage,
        optimize_for_gemm: bool,
    ) -> Result<QuantizedTensor<Self>> {
        quantize_plain::<R, Self>(x, config, usage, optimize_for_gemm, None)
    }

    fn quantize_fp8_with_scale(
        x: FloatTensor<Self>,
        fp8: Fp8Format,
        scale: super::ScaleColumns<Self>,
        usage: Usage,
        record: Option<super::AmaxHistoryColumns<Self>>,
    ) -> Result<QuantizedTensor<Self>> {
        let (rows, cols) = matrix_dims(&x.shape().as_slice());
        let format = QuantFormat::Fp8Tensor { fp8 };
        let history = history_row(record, 1)?;
        check_shape("input", rows, cols, &format)?;
        let scale = StateTarget::scales(scale, 1)?;
        let kind = elem_kind(x.dtype, "input")?;
        let x = prepare(x);
        let client = x.client.clone();
        let device = x.device.clone();
        let input = InputMatrix {
            handle: &x.handle,
            rows,
            cols,
            kind,
        };
        let directions = Directions {
            rowwise: usage.rowwise,
            columnwise: usage.columnwise,
        };
        let out = kernels::quantize_fp8_tensor(
            &client,
            input,
            fp8_kind(fp8),
            kernels::TensorScaling::Delayed {
                scale: scale.kernel_arg(),
                history: history.as_ref().map(|h| h.kernel_arg()),
            },
            directions,
            None,
            false,
        )
        .map_err(kernel_error("input"))?;
        Ok(wrap(&client, &device, out, format, (rows, cols), false, 1))
    }

    /// FP8 per-tensor and block formats: one kernel reading the groups on the device
    /// (`kernels::dequantize_fp8_grouped`); the other formats group by group.
    fn lowp_grouped_dequantize(
        q: &QuantizedTensor<Self>,
        direction: Direction,
        groups: &Groups<Self>,
        row_group: &IntTensor<Self>,
    ) -> Result<FloatTensor<Self>> {
        let Some(Storage::Quantized(storage)) = q.storage(direction) else {
            return super::grouped::dequantize_group_by_group::<Self>(q, direction, groups);
        };
        let Some((fp8, scale_kind, scales)) = fp8_scaled::<Self>(storage) else {
            return super::grouped::dequantize_group_by_group::<Self>(q, direction, groups);
        };
        let row_group = i32_labels::<R, F, I, BT>(row_group.clone());
        let client = storage.codes.client.clone();
        let handle = kernels::dequantize_fp8_grouped(
            &client,
            &storage.codes.handle,
            &scales.handle,
            &row_group.handle,
            RowGroups {
                start: &groups.start.handle,
                rows: &groups.len.handle,
                count: groups.count,
            },
            q.rows,
            q.cols,
            fp8_kind(fp8),
            scale_kind,
            direction == Direction::Columnwise,
        );
        Ok(CubeTensor::new_contiguous(
            client,
            storage.codes.device.clone(),
            Shape::new([q.rows, q.cols]),
            handle,
            DType::F32,
        ))
    }

    fn lowp_dequantize(
        q: &QuantizedTensor<Self>,
        direction: Direction,
    ) -> Result<FloatTensor<Self>> {
        let storage = match q.require(direction)? {
            Storage::Quantized(storage) => storage,
            Storage::HighPrecision(t) => {
                return Ok(Self::float_cast(t.clone(), burn::tensor::FloatDType::F32))
            }
        };
        let client = storage.codes.client.clone();
        let rowwise = direction == Direction::Rowwise;
        let (rows, cols) = (q.rows, q.cols);
        let handle = if let Some((fp8, kind, scales)) = fp8_scaled::<Self>(storage) {
            kernels::dequantize_fp8(
                &client,
                &storage.codes.handle,
                &scales.handle,
                rows,
                cols,
                fp8_kind(fp8),
                kind,
                !rowwise,
            )
        } else {
            match (&storage.format, &storage.scales) {
                (
                    QuantFormat::Mxfp8 { fp8, .. },
                    StorageScales::BlockBytes {
                        bytes,
                        layout: ScaleLayout::Compact,
                        ..
                    },
                ) => kernels::dequantize_mxfp8(
                    &client,
                    &storage.codes.handle,
                    &bytes.handle,
                    rows,
                    cols,
                    fp8_kind(*fp8),
                    rowwise,
                ),
                (
                    QuantFormat::Nvfp4 { rht, .. },
                    StorageScales::BlockBytes {
                        bytes,
                        layout: ScaleLayout::Compact,
                        ..
                    },
                ) => {
                    let amax = storage.amax.as_ref().ok_or_else(|| {
                        LowpError::invalid("NVFP4 amax", "none", "NVFP4 data carries its global amax")
                    })?;
                    kernels::dequantize_nvfp4(
                        &client,
                        &storage.codes.handle,
                        &bytes.handle,
                        &amax.handle,
                        rows,
                        cols,
                        rowwise,
                        *rht,
                    )
                }
                (
                    _,
                    StorageScales::BlockBytes {
                        layout: ScaleLayout::Swizzled,
                        ..
                    },
                ) => {
                    return Err(LowpError::invalid(
                        "scale layout",
                        "swizzled",
                        "dequantize reads compact scales: unswizzle them first",
                    ))
                }
                (format, _) => {
                    return Err(LowpError::invalid(
                        "scales",
                        format.name(),
                        "do not match the format",
                    ))
                }
            }
        };
        Ok(float_tensor(
            &client,
            &storage.codes.device,
            handle,
            rows,
            cols,
        ))
    }

    fn lowp_gemm(
        kind: super::GemmKind,
        a: &QuantizedTensor<Self>,
        b: &QuantizedTensor<Self>,
        options: super::GemmOptions<Self>,
    ) -> Result<FloatTensor<Self>> {
        #[cfg(feature = "cuda")]
        if super::cuda_gemm::is_cuda::<R>() {
            return super::cuda_gemm::gemm(kind, a, b, options);
        }
        super::gemm::dequantize_matmul(kind, a, b, burn::tensor::FloatDType::F32, options)
    }

    fn lowp_batched_matmul(
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        t: crate::backend::gemm::Transposes,
    ) -> Result<FloatTensor<Self>> {
        #[cfg(feature = "cuda")]
        if super::cuda_gemm::is_cuda::<R>() {
            return super::cuda_batched::batched_matmul::<R, F, I, BT>(a, b, t);
        }
        crate::ops::batched_matmul::batched_matmul_reference::<Self>(a, b, t)
    }

    fn lowp_gemm_group(calls: Vec<super::GemmCall<'_, Self>>) -> Result<Vec<FloatTensor<Self>>> {
        #[cfg(feature = "cuda")]
        if super::cuda_gemm::is_cuda::<R>() {
            return super::cuda_gemm::gemm_group(calls);
        }
        calls
            .into_iter()
            .map(|c| Self::lowp_gemm(c.kind, c.a, c.b, c.options))
            .collect()
    }

    fn gemm_path(
        kind: super::GemmKind,
        a: &QuantizedTensor<Self>,
        b: &QuantizedTensor<Self>,
    ) -> super::GemmPath {
        #[cfg(feature = "cuda")]
        if super::cuda_gemm::is_cuda::<R>() {
            return super::cuda_gemm::gemm_path(kind, a, b);
        }
        let _ = (kind, a, b);
        super::GemmPath::DequantizeMatmul
    }

    fn swizzle_scales(q: QuantizedTensor<Self>) -> Result<QuantizedTensor<Self>> {
        relayout(q, ScaleLayout::Swizzled, kernels::swizzle::<R>)
    }

    fn unswizzle_scales(q: QuantizedTensor<Self>) -> Result<QuantizedTensor<Self>> {
        relayout(q, ScaleLayout::Compact, kernels::unswizzle::<R>)
    }

    fn bytes_to_host(bytes: &Self::Bytes) -> Vec<u8> {
        let data = bytes
            .client
            .read_one(bytes.handle.clone())
            .expect("device read failed");
        data[..bytes.len].to_vec()
    }

    fn bytes_to_host_later(
        bytes: Vec<Self::Bytes>,
    ) -> Box<dyn FnOnce() -> Result<Vec<Vec<u8>>> + Send> {
        host_read_later(bytes, false).0
    }

    fn bytes_from_host(data: Vec<u8>, device: &Self::Device) -> Self::Bytes {
        let client = R::client(device);
        let len = data.len();
        // `create` with heap bytes queues the upload (no staging round trip to the device thread,
        // which `create_from_slice` waits for).
        let handle = client.create(burn_lowp_kernels::cubecl::bytes::Bytes::from_bytes_vec(data));
        bytes(&client, device, handle, len)
    }

    fn bytes_device(bytes: &Self::Bytes) -> Self::Device {
        bytes.device.clone()
    }

    fn bytes_slice(b: &Self::Bytes, range: std::ops::Range<usize>) -> Self::Bytes {
        assert!(range.end <= b.len, "byte range {range:?} of a {}-byte buffer", b.len);
        #[cfg(feature = "cuda")]
        if super::cuda_gemm::is_cuda::<R>() {
            // A view: CUDA binds any offset.
            let trim_end = (b.len - range.end) as u64;
            let handle = b.handle.clone().offset_start(range.start as u64).offset_end(trim_end);
            return bytes(&b.client, &b.device, handle, range.len());
        }
        // Other runtimes may bind only aligned offsets: copy (every grouped range is whole words).
        let handle = kernels::copy_range(&b.client, &b.handle, range.start, range.len());
        bytes(&b.client, &b.device, handle, range.len())
    }

    fn group_layout(m_splits: IntTensor<Self>, tokens: usize) -> Result<GroupLayout<Self>> {
        let shape = m_splits.shape();
        if shape.num_dims() != 1 || shape.as_slice()[0] == 0 {
            return Err(LowpError::shape(
                "m_splits",
                format!("shape {:?}", shape.as_slice()),
                "one split size per group, at least one group",
            ));
        }
        let count = shape.as_slice()[0];
        let splits = into_contiguous(Self::int_cast(m_splits, IntDType::I32));
        let (client, device) = (splits.client.clone(), splits.device.clone());
        let buffers = kernels::group_layout::group_layout(
            &client,
            &splits.handle,
            count,
            tokens,
            GROUP_ALIGN,
        );
        let rows = aligned_rows(tokens, count);
        let int = |handle: Handle, len: usize| {
            let t = CubeTensor::new_contiguous(
                client.clone(),
                device.clone(),
                Shape::new([len]),
                handle,
                DType::I32,
            );
            if I::dtype() == DType::I32 {
                t
            } else {
                Self::int_cast(t, IntDType::from(I::dtype()))
            }
        };
        let words = |h: &Handle, n: usize| bytes(&client, &device, h.clone(), 4 * n);
        let (start, len) = (words(&buffers.group_start, count), words(&buffers.group_rows, count));
        use super::host_copy::{split_copy, SplitCopy};
        #[cfg(feature = "cuda")]
        let background = super::cuda_gemm::is_cuda::<R>() && split_copy() == SplitCopy::Background;
        #[cfg(not(feature = "cuda"))]
        let background = false;
        let (later, arrived) = host_read_later(
            vec![
                start.clone(),
                len.clone(),
                words(&buffers.group_tokens, count),
                words(&buffers.status, kernels::group_layout::STATUS_WORDS),
            ],
            !background && split_copy() == SplitCopy::OnRead,
        );
        // On CUDA, with `LOWP_SPLIT_COPY=background`, a resolver thread takes the copy as soon as
        // it arrives, so that the grouped GEMMs see the splits as early as possible; by default
        // the first reader resolves it (`host_copy::SplitCopy`), or, on CUDA, the first `try_get`
        // after a mark on the stream says the copy has arrived (which takes no wait).
        let resolve = move || {
            let read = later()?;
            let u32s = |b: &Vec<u8>| {
                b.chunks_exact(4)
                    .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]) as usize)
                    .collect::<Vec<_>>()
            };
            let (start, len, used, status) = (u32s(&read[0]), u32s(&read[1]), u32s(&read[2]), u32s(&read[3]));
            Ok(HostGroups {
                groups: (0..count)
                    .map(|g| RowGroup {
                        start: start[g],
                        len: len[g],
                        used: used[g],
                    })
                    .collect(),
                status: SplitStatus::from_words([status[0] as u32, status[1] as u32, status[2] as u32]),
            })
        };
        let host = match (background, arrived) {
            (true, _) => HostCopy::in_background(resolve),
            (false, Some(arrived)) => HostCopy::pending_probed(resolve, arrived),
            (false, None) => HostCopy::pending(resolve),
        };
        Ok(GroupLayout {
            groups: Groups {
                count,
                rows,
                start,
                len,
                host,
            },
            tokens,
            row_group: int(buffers.row_group, rows),
            aligned_to_packed: int(buffers.aligned_to_packed, rows),
            packed_to_aligned: int(buffers.packed_to_aligned, tokens),
        })
    }

    fn lowp_quantize_grouped(
        x: FloatTensor<Self>,
        groups: &Groups<Self>,
        config: &FormatConfig,
        usage: Usage,
        scaling: GroupScaling,
    ) -> Result<QuantizedTensor<Self>> {
        let (rows, cols) = matrix_dims(&x.shape().as_slice());
        let format = config.format();
        check_shape("input", rows, cols, &format)?;
        check_grouped_rows(rows, groups)?;
        let kind = elem_kind(x.dtype, "input")?;
        let x = prepare(x);
        let client = x.client.clone();
        let device = x.device.clone();
        let input = InputMatrix {
            handle: &x.handle,
            rows,
            cols,
            kind,
        };
        let directions = Directions {
            rowwise: usage.rowwise,
            columnwise: usage.columnwise,
        };
        let row_groups = Some(RowGroups {
            start: &groups.start.handle,
            rows: &groups.len.handle,
            count: groups.count,
        });
        let shared = scaling == GroupScaling::Shared && matches!(config, FormatConfig::Fp8Current(_));
        let out = match config {
            FormatConfig::Fp8Current(c) => {
                let rule = current_scaling_rule(c);
                kernels::quantize_fp8_tensor(
                    &client,
                    input,
                    rule.fp8,
                    kernels::TensorScaling::Current { rule },
                    directions,
                    row_groups,
                    shared,
                )
            }
            FormatConfig::Fp8Block(c) => {
                let rule = ScaleRule {
                    fp8: fp8_kind(c.fp8),
                    pow2: c.pow2_scales,
                    epsilon_bits: c.amax_epsilon.to_bits(),
                    value_for_inf_bits: kind.max_finite_bits(),
                };
                kernels::quantize_fp8_block(
                    &client,
                    input,
                    rule,
                    c.block == BlockShape::OneTwentyEightSquare,
                    directions,
                    row_groups,
                )
            }
            // MXFP8 keeps no per-tensor state and never transposes: on whole 128-row groups the
            // plain kernel already writes each group as its slice alone.
            FormatConfig::Mxfp8(c) => kernels::quantize_mxfp8(
                &client,
                input,
                fp8_kind(c.fp8),
                c.block_2d,
                directions,
                false,
            ),
            FormatConfig::Nvfp4(c) => kernels::quantize_nvfp4(
                &client,
                input,
                &nvfp4_options(c, groups.count),
                directions,
                false,
                row_groups,
            ),
        }
        .map_err(kernel_error("input"))?;
        let q = wrap(&client, &device, out, format, (rows, cols), false, groups.count);
        Ok(if shared { q.with_shared_scale() } else { q })
    }

    fn quantize_fp8_with_scale_grouped(
        x: FloatTensor<Self>,
        fp8: Fp8Format,
        scales: super::ScaleColumns<Self>,
        groups: &Groups<Self>,
        usage: Usage,
        scaling: GroupScaling,
        record: Option<super::AmaxHistoryColumns<Self>>,
    ) -> Result<QuantizedTensor<Self>> {
        let (rows, cols) = matrix_dims(&x.shape().as_slice());
        let format = QuantFormat::Fp8Tensor { fp8 };
        check_shape("input", rows, cols, &format)?;
        check_grouped_rows(rows, groups)?;
        let history = history_row(record, groups.count)?;
        let scales = StateTarget::scales(scales, groups.count)?;
        let kind = elem_kind(x.dtype, "input")?;
        let shared = scaling == GroupScaling::Shared;
        let x = prepare(x);
        let (client, device) = (x.client.clone(), x.device.clone());
        let input = InputMatrix {
            handle: &x.handle,
            rows,
            cols,
            kind,
        };
        let out = kernels::quantize_fp8_tensor(
            &client,
            input,
            fp8_kind(fp8),
            kernels::TensorScaling::Delayed {
                scale: scales.kernel_arg(),
                history: history.as_ref().map(|h| h.kernel_arg()),
            },
            Directions {
                rowwise: usage.rowwise,
                columnwise: usage.columnwise,
            },
            Some(RowGroups {
                start: &groups.start.handle,
                rows: &groups.len.handle,
                count: groups.count,
            }),
            shared,
        )
        .map_err(kernel_error("input"))?;
        let q = wrap(&client, &device, out, format, (rows, cols), false, groups.count);
        Ok(if shared { q.with_shared_scale() } else { q })
    }

    /// One amax pass and one cast that read the packed rows through `aligned_to_packed`
    /// (`kernels::RowGather`): the codes, scales and amaxes of padding, then quantizing.
    fn quantize_fp8_grouped_padded(
        x: FloatTensor<Self>,
        layout: &GroupLayout<Self>,
        scaling: super::GroupedFp8Scaling<Self>,
        usage: Usage,
        group_scaling: GroupScaling,
    ) -> Result<QuantizedTensor<Self>> {
        super::grouped::check_packed_rows(&x, layout)?;
        let (rows, cols) = (layout.rows(), x.shape()[1]);
        let fp8 = match &scaling {
            super::GroupedFp8Scaling::Current(c)
            | super::GroupedFp8Scaling::CurrentFromAmax { config: c, .. } => c.fp8,
            super::GroupedFp8Scaling::Delayed { fp8, .. } => *fp8,
        };
        let format = QuantFormat::Fp8Tensor { fp8 };
        check_shape("input", rows, cols, &format)?;
        check_grouped_rows(rows, &layout.groups)?;
        let kind = elem_kind(x.dtype, "input")?;
        let shared = group_scaling == GroupScaling::Shared;
        let x = prepare(x);
        let index = i32_labels::<R, F, I, BT>(layout.aligned_to_packed.clone());
        let (client, device) = (x.client.clone(), x.device.clone());
        let input = InputMatrix {
            handle: &x.handle,
            rows: layout.tokens,
            cols,
            kind,
        };
        let gather = Some(kernels::RowGather {
            index: &index.handle,
            rows,
        });
        let row_groups = Some(RowGroups {
            start: &layout.groups.start.handle,
            rows: &layout.groups.len.handle,
            count: layout.groups.count,
        });
        let directions = Directions {
            rowwise: usage.rowwise,
            columnwise: usage.columnwise,
        };
        let count = layout.groups.count;
        let history = match &scaling {
            super::GroupedFp8Scaling::Delayed { record, .. } => history_row(record.clone(), count)?,
            _ => None,
        };
        let delayed_scales = match &scaling {
            super::GroupedFp8Scaling::Delayed { scales, .. } => {
                Some(StateTarget::scales(scales.clone(), count)?)
            }
            _ => None,
        };
        let tensor_scaling = match (&scaling, &delayed_scales) {
            (super::GroupedFp8Scaling::Current(c), _) => kernels::TensorScaling::Current {
                rule: current_scaling_rule(c),
            },
            (super::GroupedFp8Scaling::CurrentFromAmax { config, amax }, _) => {
                if amax.len != 4 * count {
                    return Err(LowpError::shape(
                        "amax",
                        format!("{} bytes", amax.len),
                        format!("one f32 amax per group ({count})"),
                    ));
                }
                kernels::TensorScaling::CurrentFromAmax {
                    rule: current_scaling_rule(config),
                    amax: &amax.handle,
                }
            }
            (_, Some(scales)) => kernels::TensorScaling::Delayed {
                scale: scales.kernel_arg(),
                history: history.as_ref().map(|h| h.kernel_arg()),
            },
            (super::GroupedFp8Scaling::Delayed { .. }, None) => unreachable!("checked above"),
        };
        let out = kernels::quantize_fp8_tensor_gathered(
            &client,
            input,
            fp8_kind(fp8),
            tensor_scaling,
            directions,
            row_groups,
            shared,
            gather,
        )
        .map_err(kernel_error("input"))?;
        let q = wrap(&client, &device, out, format, (rows, cols), false, layout.groups.count);
        Ok(if shared { q.with_shared_scale() } else { q })
    }

    /// One read of `dy` (through the row map where packed) for the per-group column sums and,
    /// with `amax`, the per-group amaxes (`kernels::group_dbias_amax`).
    fn grouped_dbias_amax(
        dy: FloatTensor<Self>,
        rows: super::InputRows,
        layout: &GroupLayout<Self>,
        amax: bool,
    ) -> Result<(FloatTensor<Self>, Option<Self::Bytes>)> {
        let (dy_rows, cols) = matrix_dims(&dy.shape().as_slice());
        if dy_rows != rows.rows(layout) {
            return Err(LowpError::shape(
                "grouped dbias grad_output",
                format!("[{dy_rows}, {cols}]"),
                format!("the {} [{}, cols] rows of its layout", rows.name(), rows.rows(layout)),
            ));
        }
        let kind = match elem_kind(dy.dtype, "grouped dbias grad_output") {
            Ok(kind) if cols % 2 == 0 && layout.rows() * cols < u32::MAX as usize => kind,
            _ => return Ok((super::grouped::grouped_dbias_after_move(dy, rows, layout)?, None)),
        };
        check_grouped_rows(layout.rows(), &layout.groups)?;
        let dy = prepare(dy);
        let index = i32_labels::<R, F, I, BT>(layout.aligned_to_packed.clone());
        let client = dy.client.clone();
        let (sums, amaxes) = kernels::group_dbias_amax::group_dbias_amax(
            &client,
            InputMatrix {
                handle: &dy.handle,
                rows: dy_rows,
                cols,
                kind,
            },
            RowGroups {
                start: &layout.groups.start.handle,
                rows: &layout.groups.len.handle,
                count: layout.groups.count,
            },
            (rows == super::InputRows::Packed).then_some(kernels::RowGather {
                index: &index.handle,
                rows: layout.rows(),
            }),
            amax,
        )
        .map_err(kernel_error("grouped dbias grad_output"))?;
        let sums = CubeTensor::new_contiguous(
            client.clone(),
            dy.device.clone(),
            Shape::new([layout.groups.count, cols]),
            sums,
            DType::F32,
        );
        let amaxes = amaxes.map(|h| bytes(&client, &dy.device, h, 4 * layout.groups.count));
        Ok((sums, amaxes))
    }

    fn lowp_grouped_gemm_unscaled(
        kind: super::GemmKind,
        a: GroupedOperand<Self>,
        b: GroupedOperand<Self>,
        options: super::GemmOptions<Self>,
    ) -> Result<(FloatTensor<Self>, Option<(FloatTensor<Self>, FloatTensor<Self>)>)> {
        #[cfg(feature = "cuda")]
        if super::cuda_gemm::is_cuda::<R>() {
            return super::cuda_grouped::grouped_gemm_unscaled(kind, a, b, options, true);
        }
        Ok((super::grouped::grouped_gemm_per_group(kind, a, b, options)?, None))
    }

    fn lowp_grouped_gemm(
        kind: super::GemmKind,
        a: GroupedOperand<Self>,
        b: GroupedOperand<Self>,
        options: super::GemmOptions<Self>,
    ) -> Result<FloatTensor<Self>> {
        #[cfg(feature = "cuda")]
        if super::cuda_gemm::is_cuda::<R>() {
            return super::cuda_grouped::grouped_gemm(kind, a, b, options);
        }
        super::grouped::grouped_gemm_per_group(kind, a, b, options)
    }

    fn grouped_gemm_path(
        kind: super::GemmKind,
        a: GroupedOperand<Self>,
        b: GroupedOperand<Self>,
    ) -> GroupedGemmPath {
        #[cfg(feature = "cuda")]
        if super::cuda_gemm::is_cuda::<R>() {
            return super::cuda_grouped::grouped_gemm_path(kind, a, b);
        }
        let _ = (kind, a, b);
        GroupedGemmPath::PerGroup(super::GemmPath::DequantizeMatmul)
    }

    /// One kernel moving whole rows as 32-bit words (`kernels::row_gather`); Burn's `select`
    /// where a row is not a whole number of words or the index is not i32/i64.
    fn lowp_gather_rows(t: FloatTensor<Self>, index: IntTensor<Self>) -> FloatTensor<Self> {
        let shape = t.shape();
        let index_kind = index_kind(index.dtype);
        let row_bytes = shape.as_slice().get(1).map(|c| c * t.dtype.size());
        let (Some(index_kind), Some(row_bytes), 2) = (index_kind, row_bytes, shape.num_dims())
        else {
            return crate::ops::grouped_rows::select_rows_or_zero::<Self>(t, index);
        };
        if row_bytes % 4 != 0 {
            return crate::ops::grouped_rows::select_rows_or_zero::<Self>(t, index);
        }
        let t = into_contiguous(t);
        let index = into_contiguous(index);
        let (rows, cols, n) = (shape[0], shape[1], index.shape()[0]);
        let handle = kernels::row_gather::row_gather(
            &t.client,
            &t.handle,
            rows,
            &index.handle,
            index_kind,
            n,
            row_bytes / 4,
        );
        CubeTensor::new_contiguous(t.client.clone(), t.device.clone(), Shape::new([n, cols]), handle, t.dtype)
    }

    /// One kernel per parameter (`kernels::adamw`, `cube_optim.rs`).
    fn lowp_adamw_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<(FloatTensor<Self>, FloatTensor<Self>)>,
        step: &crate::backend::optim::AdamWStep,
    ) -> crate::backend::optim::AdamWTensors<FloatTensor<Self>> {
        super::cube_optim::adamw_step::<R, F, I, BT>(param, grad, moments, step)
    }

    /// One kernel (`kernels::group_epilogue`; two for f32 with scales and biases) where y and the
    /// bias share a dtype and rows are whole words; Burn ops otherwise.
    fn lowp_group_epilogue(
        y: FloatTensor<Self>,
        row_group: IntTensor<Self>,
        epilogue: super::GroupEpilogue<Self>,
    ) -> FloatTensor<Self> {
        let shape = y.shape();
        let kind = elem_kind(y.dtype, "grouped GEMM output").ok();
        let groups = match (&epilogue.bias, &epilogue.scales) {
            (Some(b), _) => b.shape()[0],
            (None, Some((a, _))) => a.shape()[0],
            (None, None) => 0,
        };
        let fits = shape.num_dims() == 2
            && shape[1] % 2 == 0
            && epilogue.bias.as_ref().is_none_or(|b| {
                b.shape().num_dims() == 2 && b.shape()[1] == shape[1] && b.dtype == y.dtype
            })
            && epilogue.scales.as_ref().is_none_or(|(a, b)| {
                a.dtype == DType::F32
                    && b.dtype == DType::F32
                    && a.shape().num_elements() == groups
                    && b.shape().num_elements() == groups
            })
            && epilogue.gather.as_ref().is_none_or(|g| g.shape().num_dims() == 1);
        let (Some(kind), true) = (kind, fits) else {
            return super::grouped::group_epilogue_by_ops(y, row_group, epilogue);
        };
        // (Labels and the gather index in one integer type: i32, as the layout makes them.)
        let row_group = i32_labels::<R, F, I, BT>(row_group);
        let gather = epilogue.gather.map(i32_labels::<R, F, I, BT>);
        let bias = epilogue.bias.map(into_contiguous);
        let scales = epilogue.scales.map(|(a, b)| (into_contiguous(a), into_contiguous(b)));
        let y = into_contiguous(y);
        let (rows, cols) = (shape[0], shape[1]);
        let out_rows = gather.as_ref().map_or(rows, |g| g.shape()[0]);
        let handle = kernels::group_epilogue::group_epilogue(
            &y.client,
            &y.handle,
            &row_group.handle,
            kernels::row_gather::IndexKind::I32,
            rows,
            cols,
            groups,
            kind,
            kernels::group_epilogue::Epilogue {
                bias: bias.as_ref().map(|b| &b.handle),
                scales: scales.as_ref().map(|(a, b)| (&a.handle, &b.handle)),
                gather: gather.as_ref().map(|g| (&g.handle, out_rows)),
            },
        );
        CubeTensor::new_contiguous(y.client.clone(), y.device.clone(), Shape::new([out_rows, cols]), handle, y.dtype)
    }

    /// On the device: each 128-row chunk summed (`sum_dim`), then the chunks of each group added
    /// into its row (`select_assign`), without reading the groups on the host.
    fn grouped_column_sum(
        t: FloatTensor<Self>,
        layout: &GroupLayout<Self>,
    ) -> Result<FloatTensor<Self>> {
        use burn::tensor::{IndexingUpdateOp, Int, Tensor, TensorPrimitive};
        let t = Tensor::<Self, 2>::from_primitive(TensorPrimitive::Float(t));
        let [rows, cols] = t.dims();
        let chunks = rows / GROUP_ALIGN;
        let partial = t.reshape([chunks, GROUP_ALIGN, cols]).sum_dim(1).reshape([chunks, cols]);
        // A chunk's first row is a token of its group (or tail, group `count`).
        let chunk_group = Tensor::<Self, 1, Int>::from_primitive(layout.row_group.clone())
            .reshape([chunks, GROUP_ALIGN])
            .slice([0..chunks, 0..1])
            .reshape([chunks]);
        let count = layout.groups.count;
        let sums = Tensor::<Self, 2>::zeros(
            [count + 1, cols],
            burn::tensor::TensorCreationOptions::new(partial.device()).with_dtype(partial.dtype()),
        )
        .select_assign(0, chunk_group, partial, IndexingUpdateOp::Add);
        Ok(sums.slice([0..count, 0..cols]).into_primitive().tensor())
    }

    fn quantize_fp8_current_with_amax(
        x: FloatTensor<Self>,
        config: &FormatConfig,
        amax: &Self::Bytes,
        usage: Usage,
    ) -> Result<QuantizedTensor<Self>> {
        quantize_plain::<R, Self>(x, config, usage, false, Some(amax))
    }

    fn lowp_tensor_stats(
        x: FloatTensor<Self>,
        error: Option<(FloatTensor<Self>, FloatTensor<Self>)>,
        labels: Option<(IntTensor<Self>, usize)>,
    ) -> Result<Self::Bytes> {
        let (rows, cols) = matrix_dims(&x.shape().as_slice());
        if rows == 0 || cols % 2 != 0 {
            return super::tensor_stats_on_host::<Self>(x, error, labels);
        }
        let labels = labels.map(|(row_group, count)| (i32_labels::<R, F, I, BT>(row_group), count));
        let kind = elem_kind(x.dtype, "debug statistics input")?;
        let x = prepare(x);
        let client = x.client.clone();
        let error = error.map(|(dq, limit)| {
            let dq = prepare(Self::float_cast(dq, burn::tensor::FloatDType::F32));
            let limit = prepare(Self::float_cast(limit, burn::tensor::FloatDType::F32));
            (dq, limit)
        });
        let input = InputMatrix {
            handle: &x.handle,
            rows,
            cols,
            kind,
        };
        let handle = kernels::stats::tensor_stats(
            &client,
            input,
            error.as_ref().map(|(dq, limit)| kernels::stats::StatsError::Dequantized {
                values: &dq.handle,
                limits: &limit.handle,
            }),
            labels.as_ref().map(|(row_group, count)| kernels::stats::RowLabels {
                row_group: &row_group.handle,
                count: *count,
            }),
        )
        .map_err(|e| LowpError::shape("debug statistics input", e.value, e.rule))?;
        let len = kernels::stats::stats_records(rows, cols) * kernels::stats::STAT_FIELDS * 4;
        Ok(bytes(&client, &x.device, handle, len))
    }

    fn lowp_quantization_stats(
        x: FloatTensor<Self>,
        q: &QuantizedTensor<Self>,
        directions: &[Direction],
        grouped: Option<(&Groups<Self>, IntTensor<Self>)>,
    ) -> Result<Option<Vec<Self::Bytes>>> {
        // Each direction's codes and scales, with the format they share.
        let mut copies = Vec::new();
        for &direction in directions {
            let Some(Storage::Quantized(storage)) = q.storage(direction) else {
                return Ok(None);
            };
            let Some((fp8, kind, scales)) = fp8_scaled::<Self>(storage) else {
                return Ok(None);
            };
            let codes = kernels::stats::Fp8Codes {
                codes: &storage.codes.handle,
                scales: &scales.handle,
            };
            copies.push((direction, fp8, kind, codes));
        }
        let copy = match copies.as_slice() {
            [(Direction::Rowwise, ..)] => kernels::stats::Fp8Copy::Rowwise(copies[0].3),
            [(Direction::Columnwise, ..)] => kernels::stats::Fp8Copy::Columnwise(copies[0].3),
            [(Direction::Rowwise, a, ka, r), (Direction::Columnwise, b, kb, c)]
            | [(Direction::Columnwise, b, kb, c), (Direction::Rowwise, a, ka, r)]
                if a == b && ka == kb =>
            {
                kernels::stats::Fp8Copy::Both {
                    rowwise: *r,
                    columnwise: *c,
                }
            }
            _ => return Ok(None),
        };
        let (_, fp8, scales_kind, _) = copies[0];
        let (rows, cols) = matrix_dims(&x.shape().as_slice());
        if rows == 0 || cols % 2 != 0 || cols != q.cols || rows > q.rows {
            return Ok(None);
        }
        let kind = elem_kind(x.dtype, "debug statistics input")?;
        let x = prepare(x);
        let client = x.client.clone();
        let labels = grouped
            .as_ref()
            .map(|(groups, row_group)| (i32_labels::<R, F, I, BT>(row_group.clone()), groups.count));
        let input = InputMatrix {
            handle: &x.handle,
            rows,
            cols,
            kind,
        };
        let error = kernels::stats::StatsError::Fp8Codes {
            copy,
            groups: grouped.as_ref().map(|(groups, _)| RowGroups {
                start: &groups.start.handle,
                rows: &groups.len.handle,
                count: groups.count,
            }),
            code_rows: q.rows,
            fp8: fp8_kind(fp8),
            fp8_max: fp8.max(),
            scales_kind,
        };
        let handle = kernels::stats::tensor_stats(
            &client,
            input,
            Some(error),
            labels.as_ref().map(|(row_group, count)| kernels::stats::RowLabels {
                row_group: &row_group.handle,
                count: *count,
            }),
        )
        .map_err(|e| LowpError::shape("debug statistics input", e.value, e.rule))?;
        // One set of records per direction, rowwise first: each direction's part (a view on CUDA).
        let len = kernels::stats::stats_records(rows, cols) * kernels::stats::STAT_FIELDS * 4;
        let all = bytes(&client, &x.device, handle, directions.len() * len);
        if directions.len() == 1 {
            return Ok(Some(vec![all]));
        }
        let set = |d: &Direction| {
            let s = if directions.len() == 2 && *d == Direction::Columnwise { 1 } else { 0 };
            Self::bytes_slice(&all, s * len..(s + 1) * len)
        };
        Ok(Some(directions.iter().map(set).collect()))
    }

    fn lowp_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: Option<FloatTensor<Self>>,
        spec: &super::NormSpec,
        want_amax: bool,
    ) -> Result<super::NormForward<FloatTensor<Self>, Self::Bytes>> {
        super::cube_norm_act::norm_forward(x, gamma, beta, spec, want_amax)
    }

    fn lowp_norm_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        spec: &super::NormSpec,
        beta: bool,
    ) -> Result<super::NormBackward<FloatTensor<Self>>> {
        super::cube_norm_act::norm_backward(dy, x, gamma, mean, rstd, spec, beta)
    }

    fn lowp_activation_forward(
        h: FloatTensor<Self>,
        spec: &crate::backend::activation::ActivationSpec,
        want_amax: bool,
    ) -> Result<super::ActivationOutput<FloatTensor<Self>, Self::Bytes>> {
        super::cube_norm_act::activation_forward(h, spec, want_amax)
    }

    /// One launch of the FP8 cast with the activation as its prologue
    /// (`kernels::quantize_fp8_tensor_activated`).
    fn lowp_activation_quantize_fp8_with_scale(
        h: FloatTensor<Self>,
        spec: &crate::backend::activation::ActivationSpec,
        fp8: Fp8Format,
        scale: super::ScaleColumns<Self>,
        usage: Usage,
        record: Option<super::AmaxHistoryColumns<Self>>,
    ) -> Result<Option<QuantizedTensor<Self>>> {
        let history = history_row(record, 1)?;
        let scale = StateTarget::scales(scale, 1)?;
        activated_fp8_cast::<R, Self>(h, spec, fp8, usage, |client, input, prologue, directions| {
            kernels::quantize_fp8_tensor_activated(
                client,
                input,
                prologue,
                fp8_kind(fp8),
                scale.kernel_arg(),
                history.as_ref().map(|h| h.kernel_arg()),
                directions,
            )
        })
    }

    /// An amax pass over the activation and the FP8 cast with the activation as its prologue
    /// (`kernels::quantize_fp8_tensor_activated_current`).
    fn lowp_activation_quantize_fp8_current(
        h: FloatTensor<Self>,
        spec: &crate::backend::activation::ActivationSpec,
        config: &FormatConfig,
        usage: Usage,
    ) -> Result<Option<QuantizedTensor<Self>>> {
        let FormatConfig::Fp8Current(c) = config else {
            return Ok(None);
        };
        let rule = current_scaling_rule(c);
        activated_fp8_cast::<R, Self>(h, spec, c.fp8, usage, |client, input, prologue, directions| {
            kernels::quantize_fp8_tensor_activated_current(client, input, prologue, rule, directions)
        })
    }

    fn lowp_rope(
        x: FloatTensor<Self>,
        freq: FloatTensor<Self>,
        positions: crate::backend::attention::RopePositions,
        inverse: bool,
    ) -> Result<FloatTensor<Self>> {
        super::cube_norm_act::rope(x, freq, positions, inverse)
    }

    fn lowp_causal_softmax(x: FloatTensor<Self>, scale: f32) -> Result<FloatTensor<Self>> {
        super::cube_norm_act::causal_softmax(x, None, scale)
    }

    fn lowp_split_heads(
        x: FloatTensor<Self>,
        freq: Option<FloatTensor<Self>>,
        layout: crate::backend::attention::HeadLayout,
    ) -> Result<Vec<FloatTensor<Self>>> {
        super::cube_norm_act::split_heads(x, freq, layout)
    }

    fn lowp_merge_heads(
        parts: Vec<FloatTensor<Self>>,
        freq: Option<FloatTensor<Self>>,
        layout: crate::backend::attention::HeadLayout,
    ) -> Result<FloatTensor<Self>> {
        super::cube_norm_act::merge_heads(parts, freq, layout)
    }

    fn lowp_top_k(scores: FloatTensor<Self>, k: usize) -> Result<IntTensor<Self>> {
        super::cube_routing::top_k::<R, Self>(scores, k, I::dtype())
    }

    fn lowp_expert_positions(
        expert: IntTensor<Self>,
        experts: usize,
    ) -> Result<(IntTensor<Self>, IntTensor<Self>)> {
        super::cube_routing::expert_positions::<R, Self>(expert, experts, I::dtype())
    }

    fn lowp_route_rows(
        position: IntTensor<Self>,
        layout: &GroupLayout<Self>,
        k: usize,
    ) -> Result<crate::backend::routing::TokenRoutes<Self>> {
        super::cube_routing::route_rows::<R, Self>(position, layout, k, I::dtype())
    }

    fn lowp_combine_rows(
        y: FloatTensor<Self>,
        weights: Option<FloatTensor<Self>>,
        routes: &crate::backend::routing::TokenRoutes<Self>,
    ) -> Result<FloatTensor<Self>> {
        super::cube_routing::combine::<R, Self>(y, weights, routes)
    }

    fn lowp_combine_rows_backward(
        dout: FloatTensor<Self>,
        weights: Option<FloatTensor<Self>>,
        routes: &crate::backend::routing::TokenRoutes<Self>,
    ) -> Result<FloatTensor<Self>> {
        super::cube_routing::combine_backward::<R, Self>(dout, weights, routes)
    }

    fn lowp_combine_weights_grad(
        dout: FloatTensor<Self>,
        y: FloatTensor<Self>,
        routes: &crate::backend::routing::TokenRoutes<Self>,
    ) -> Result<FloatTensor<Self>> {
        super::cube_routing::combine_weights_grad::<R, Self>(dout, y, routes)
    }

    fn lowp_causal_softmax_backward(
        p: FloatTensor<Self>,
        dp: FloatTensor<Self>,
        scale: f32,
    ) -> Result<FloatTensor<Self>> {
        super::cube_norm_act::causal_softmax(p, Some(dp), scale)
    }

    fn lowp_dbias_amax(dy: FloatTensor<Self>) -> Result<(FloatTensor<Self>, Option<Self::Bytes>)> {
        super::cube_norm_act::dbias_amax(dy)
    }

    fn lowp_activation_backward(
        dy: FloatTensor<Self>,
        h: FloatTensor<Self>,
        spec: &crate::backend::activation::ActivationSpec,
        want_amax: bool,
        want_dbias: bool,
    ) -> Result<super::ActivationOutput<FloatTensor<Self>, Self::Bytes>> {
        super::cube_norm_act::activation_backward(dy, h, spec, want_amax, want_dbias)
    }

    fn float_from_bytes(bytes: &Self::Bytes, shape: [usize; 2]) -> FloatTensor<Self> {
        float_tensor(
            &bytes.client,
            &bytes.device,
            bytes.handle.clone(),
            shape[0],
            shape[1],
        )
    }

    fn float_from_host(m: &HostMatrix, device: &Self::Device) -> FloatTensor<Self> {
        let client = R::client(device);
        let (bytes, dtype): (Vec<u8>, DType) = match m.dtype {
            InputDtype::F32 => (
                m.values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                DType::F32,
            ),
            InputDtype::F16 => (
                m.values
                    .iter()
                    .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                    .collect(),
                DType::F16,
            ),
            InputDtype::BF16 => (
                m.values
                    .iter()
                    .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                    .collect(),
                DType::BF16,
            ),
        };
        let handle = client.create_from_slice(&bytes);
        CubeTensor::new_contiguous(
            client,
            device.clone(),
            Shape::new([m.rows, m.cols]),
            handle,
            dtype,
        )
    }
}
