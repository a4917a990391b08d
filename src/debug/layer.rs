//! What a module's op sees of a debug session: `LayerDebug`, the section that selects the layer
//! and the current iteration, taken when the op is built. The op reports its tensors
//! (`observe`: statistics and AutoswitchGemm metrics, at sampling iterations only) and asks for a
//! GEMM's operands (`operands`: the quantized ones, or high-precision ones when a feature says so).

use std::sync::{Arc, Mutex};

use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, FloatDType, Shape, TensorMetadata};

use super::config::{
    GemmName, HighPrecisionSource, Section, SwitchTiming, TensorKind, WhatIfRecipe,
};
use super::read_batch::ReadBatch;
use super::session::{active, DebugSession, LaterRead, PendingStats, ScaleDecode, StatsRead};
use super::stats::split_partials_by_group;
use crate::backend::grouped::{HostCopy, HostGroups};
use crate::deferred::Deferred;
use crate::backend::{Groups, LowpBackend, LowpTypes};
use crate::format::grouped::group_ranges;
use crate::error::{LowpError, Result};
use crate::format::fp8_block::BlockShape;
use crate::format::{Direction, Fp8CurrentScaling, Fp8Format, FormatConfig, QuantFormat, Usage};
use crate::quant::{quantize, QuantizeCall, QuantizedTensor, QuantizerSpec, Storage, StorageScales};
use crate::recipe::ModuleKind;

/// The debug view of one layer for one op call.
#[derive(Clone)]
pub struct LayerDebug {
    session: Arc<DebugSession>,
    section: Arc<Section>,
    layer: String,
    iteration: u64,
    /// Rows of the token-indexed tensors that hold data (an expert's tokens; the rest is the
    /// aligned layout's zero padding, left out of the statistics).
    data_rows: Option<usize>,
}

impl std::fmt::Debug for LayerDebug {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LayerDebug({} @ {})", self.layer, self.iteration)
    }
}

/// How a GEMM runs this iteration.
#[derive(Debug, Clone, PartialEq)]
pub enum GemmMode {
    Quantized,
    HighPrecision(HighPrecisionSource),
    /// High precision on `tensors` quantized and dequantized with a current per-tensor scale.
    FakeQuant {
        fp8: Fp8Format,
        tensors: Vec<TensorKind>,
    },
}

/// A GEMM operand as the op has it: the high-precision tensor (when kept) and its quantized form,
/// the representation the GEMM reads.
pub struct Operand<'a, Q: LowpBackend> {
    pub tensor: TensorKind,
    pub high_precision: Option<&'a FloatTensor<Q>>,
    pub quantized: &'a QuantizedTensor<Q>,
    pub direction: Direction,
}

/// The direction of `tensor`'s copy that `gemm` reads (TE's tensor-to-GEMM mapping).
pub fn direction_for(tensor: TensorKind, gemm: GemmName) -> Direction {
    match (tensor, gemm) {
        (TensorKind::Weight, GemmName::Fprop)
        | (TensorKind::Activation, GemmName::Fprop)
        | (TensorKind::Gradient, GemmName::Dgrad) => Direction::Rowwise,
        _ => Direction::Columnwise,
    }
}

/// The tensor quantized as `spec` for a what-if recipe (E5M2 for gradients where TE's hybrid
/// would use it; 2D blocks for weights).
fn what_if_spec(recipe: WhatIfRecipe, tensor: TensorKind) -> QuantizerSpec {
    let weight = tensor == TensorKind::Weight;
    match recipe {
        WhatIfRecipe::Fp8CurrentScaling => QuantizerSpec::Fp8Current {
            fp8: if tensor == TensorKind::Gradient {
                Fp8Format::E5M2
            } else {
                Fp8Format::E4M3
            },
            pow2_scales: false,
            amax_epsilon: 0.0,
        },
        WhatIfRecipe::Fp8BlockScaling => QuantizerSpec::Fp8Block {
            fp8: Fp8Format::E4M3,
            block: if weight {
                BlockShape::OneTwentyEightSquare
            } else {
                BlockShape::OneByOneTwentyEight
            },
            pow2_scales: true,
            amax_epsilon: 0.0,
        },
        WhatIfRecipe::Mxfp8 => QuantizerSpec::Mxfp8 {
            fp8: Fp8Format::E4M3,
            block_2d: false,
        },
        WhatIfRecipe::Nvfp4 => QuantizerSpec::Nvfp4 {
            block_2d: weight,
            rht: false,
            stochastic_rounding: false,
        },
    }
}

/// A high-precision operand: one `[rows, cols]` tensor serving both directions.
pub(crate) fn high_precision<Q: LowpBackend>(t: FloatTensor<Q>, rows: usize, cols: usize) -> QuantizedTensor<Q> {
    let t = Q::float_reshape(t, Shape::new([rows, cols]));
    QuantizedTensor {
        rows,
        cols,
        rowwise: Some(Storage::HighPrecision(t.clone())),
        columnwise: Some(Storage::HighPrecision(t)),
    }
}

impl LayerDebug {
    /// The debug view of layer `name` of `kind` when a session is installed on this thread and a
    /// section selects the layer.
    pub fn for_layer(name: &str, kind: &ModuleKind) -> Result<Option<LayerDebug>> {
        let Some(session) = active() else {
            return Ok(None);
        };
        let Some(section) = session.section_for(name, kind)? else {
            return Ok(None);
        };
        let section = Arc::new(section.clone());
        Ok(Some(LayerDebug {
            iteration: session.iteration(),
            session,
            section,
            layer: name.to_string(),
            data_rows: None,
        }))
    }

    /// The same view for a sub-layer (LayerNormMLP's `<name>.fc1`).
    pub fn sublayer(&self, name: String) -> LayerDebug {
        LayerDebug {
            layer: name,
            ..self.clone()
        }
    }

    /// The view of an expert of a grouped layer (`<name>.gemm_<g>`) whose token-indexed tensors
    /// hold `tokens` data rows, then zero padding.
    pub fn expert(&self, name: String, tokens: usize) -> LayerDebug {
        LayerDebug {
            layer: name,
            data_rows: Some(tokens),
            ..self.clone()
        }
    }

    /// `t` without the padding rows of a token-indexed tensor.
    fn data_view<Q: LowpBackend>(&self, tensor: TensorKind, t: FloatTensor<Q>) -> FloatTensor<Q> {
        let token_rows = matches!(
            tensor,
            TensorKind::Activation | TensorKind::Gradient | TensorKind::Output | TensorKind::Dgrad
        );
        let shape = t.shape();
        let dims = shape.as_slice();
        match (self.data_rows, token_rows, dims) {
            (Some(r), true, [rows, cols]) if r < *rows => {
                Q::float_slice(t, &[(0..r).into(), (0..*cols).into()])
            }
            _ => t,
        }
    }

    pub fn layer(&self) -> &str {
        &self.layer
    }

    pub fn iteration(&self) -> u64 {
        self.iteration
    }

    /// Whether any feature acts on this layer this iteration (a grouped layer then runs its
    /// experts one by one so that each is seen, scaled and switched on its own).
    pub fn acts(&self) -> bool {
        let f = &self.section.features;
        let it = self.iteration;
        f.disable_quantization_gemm.is_some()
            || f.per_tensor_scaling.is_some()
            || f.disable_quantization_layer.is_some()
            || f.fake_quant.is_some()
            || f.log_tensor_stats
                .as_ref()
                .is_some_and(|l| l.schedule().samples(it))
            || f.log_quantized_tensor_stats
                .as_ref()
                .is_some_and(|l| l.schedule().samples(it))
            || self.session.autoswitch_may_act(&self.section, &self.layer)
    }

    /// Whether a grouped layer must run its experts one by one this iteration (`experts`: its
    /// experts, named `<name>.gemm_<g>`): a feature changes how a GEMM runs (high precision, fake
    /// quantization, per-tensor scaling), AutoswitchGemm decides within the iteration
    /// (`same_iteration` timing), it holds one of these experts' GEMMs in high precision now (the
    /// samples due now are applied here, as each GEMM would apply them), or a what-if cast is
    /// sampled. Statistics and `next_sample` metrics alone keep the grouped GEMMs: the op then
    /// observes every expert of the grouped tensors at once (`observe_experts`).
    pub fn changes_expert_gemms(&self, name: &str, experts: &[usize]) -> Result<bool> {
        let f = &self.section.features;
        if f.disable_quantization_gemm.is_some()
            || f.disable_quantization_layer.is_some()
            || f.fake_quant.is_some()
            || f.per_tensor_scaling.is_some()
        {
            return Ok(true);
        }
        // What-if casts quantize each expert's slice as its own tensor.
        if f.log_quantized_tensor_stats
            .as_ref()
            .is_some_and(|l| !l.what_if.is_empty() && l.schedule().samples(self.iteration))
        {
            return Ok(true);
        }
        let Some(a) = &f.autoswitch_gemm else {
            return Ok(false);
        };
        if a.timing == SwitchTiming::SameIteration {
            return Ok(self.session.autoswitch_may_act(&self.section, &self.layer));
        }
        for g in experts {
            let expert = format!("{name}.gemm_{g}");
            for gemm in &a.gemms {
                if self
                    .session
                    .autoswitch_high_precision(&self.section, &expert, *gemm)?
                {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// Whether `tensor` is current-scaled instead of delayed-scaled (`PerTensorScaling`).
    pub fn per_tensor_scaling(&self, tensor: TensorKind) -> bool {
        self.section
            .features
            .per_tensor_scaling
            .as_ref()
            .is_some_and(|p| p.tensors.contains(&tensor))
    }

    /// Whether the op must keep its high-precision inputs for backward (a backward GEMM may run
    /// on the originals this iteration).
    pub fn keeps_originals(&self) -> bool {
        let f = &self.section.features;
        f.disable_quantization_gemm.is_some()
            || f.disable_quantization_layer.is_some()
            || f.fake_quant.is_some()
            || f.autoswitch_gemm.as_ref().is_some_and(|a| {
                a.high_precision_source == HighPrecisionSource::Original
                    && self.session.autoswitch_may_act(&self.section, &self.layer)
            })
    }

    /// How `gemm` runs now: any feature asking for high precision wins ("any says high precision,
    /// high precision"; TE ORs the features' *quantized* answers instead).
    pub fn gemm_mode(&self, gemm: GemmName) -> Result<GemmMode> {
        let f = &self.section.features;
        if f.disable_quantization_layer.is_some()
            || f
                .disable_quantization_gemm
                .as_ref()
                .is_some_and(|d| d.gemms.contains(&gemm))
        {
            return Ok(GemmMode::HighPrecision(HighPrecisionSource::Original));
        }
        if self
            .session
            .autoswitch_high_precision(&self.section, &self.layer, gemm)?
        {
            let source = f
                .autoswitch_gemm
                .as_ref()
                .map(|a| a.high_precision_source)
                .unwrap_or_default();
            return Ok(GemmMode::HighPrecision(source));
        }
        if let Some(q) = f.fake_quant.as_ref().filter(|q| q.gemms.contains(&gemm)) {
            return Ok(GemmMode::FakeQuant {
                fp8: q.quant_format.fp8(),
                tensors: q.tensors.clone(),
            });
        }
        Ok(GemmMode::Quantized)
    }

    /// The operands `gemm` multiplies, in `dtype` when they run in high precision.
    pub fn operands<Q: LowpBackend>(
        &self,
        gemm: GemmName,
        a: Operand<'_, Q>,
        b: Operand<'_, Q>,
        dtype: FloatDType,
    ) -> Result<(QuantizedTensor<Q>, QuantizedTensor<Q>)> {
        let mode = self.gemm_mode(gemm)?;
        let one = |o: &Operand<'_, Q>| -> Result<QuantizedTensor<Q>> {
            let q = o.quantized;
            let cast = |t: FloatTensor<Q>| {
                if t.dtype() == DType::from(dtype) {
                    t
                } else {
                    Q::float_cast(t, dtype)
                }
            };
            let dequantized = || -> Result<QuantizedTensor<Q>> {
                match q.require(o.direction)? {
                    Storage::HighPrecision(_) => Ok(q.clone()),
                    Storage::Quantized(_) => Ok(high_precision(
                        cast(Q::quantize_dequantize(q, o.direction)?),
                        q.rows,
                        q.cols,
                    )),
                }
            };
            let original = || -> Result<QuantizedTensor<Q>> {
                match o.high_precision {
                    Some(t) => Ok(high_precision(cast(t.clone()), q.rows, q.cols)),
                    // Not kept (a quantized-only weight): its dequantized copy.
                    None => dequantized(),
                }
            };
            match &mode {
                GemmMode::Quantized => Ok(q.clone()),
                GemmMode::HighPrecision(HighPrecisionSource::Original) => original(),
                GemmMode::HighPrecision(HighPrecisionSource::Dequantized) => dequantized(),
                GemmMode::FakeQuant { fp8, tensors } if tensors.contains(&o.tensor) => {
                    let Some(t) = o.high_precision else {
                        return dequantized();
                    };
                    let config = FormatConfig::Fp8Current(Fp8CurrentScaling::new(*fp8));
                    let fq = Q::quantize_tensor(t.clone(), &config, Usage::ROWWISE, false)?;
                    Ok(high_precision(
                        cast(Q::quantize_dequantize(&fq, Direction::Rowwise)?),
                        q.rows,
                        q.cols,
                    ))
                }
                GemmMode::FakeQuant { .. } => original(),
            }
        };
        Ok((one(&a)?, one(&b)?))
    }

    /// Reports `tensor` (high precision `x`, and its quantized form for operands): statistics
    /// and AutoswitchGemm metrics are computed on the device where a schedule samples now, and
    /// read back by one device read.
    pub fn observe<Q: LowpBackend>(
        &self,
        tensor: TensorKind,
        x: &FloatTensor<Q>,
        quantized: Option<&QuantizedTensor<Q>>,
    ) -> Result<()> {
        let mut batch = ReadBatch::new();
        let observed = self.observe_into(tensor, x, quantized, None, &mut batch);
        batch.flush();
        observed
    }

    /// Reports `tensor` of every expert of this grouped layer (`<layer>.gemm_<g>`, TE's debug
    /// GroupedLinear): `x` and its grouped quantized form `quantized` hold the experts' rows as
    /// `rows` says. Each statistic is one pass and one device read for all experts: the records
    /// (128-row blocks, within one expert) carry their expert, and the host splits them when it
    /// logs (the split sizes are not read here).
    pub fn observe_experts<Q: LowpBackend>(
        &self,
        tensor: TensorKind,
        x: &FloatTensor<Q>,
        quantized: Option<&QuantizedTensor<Q>>,
        rows: &ExpertRows<Q>,
    ) -> Result<()> {
        let mut batch = ReadBatch::new();
        let observed = self.observe_into(tensor, x, quantized, Some(rows), &mut batch);
        batch.flush();
        observed
    }

    /// Where the statistics of an observation go: to this layer, or split per expert.
    fn add_read<Q: LowpBackend>(
        &self,
        batch: &mut ReadBatch<Q>,
        bytes: Vec<Q::Bytes>,
        experts: Option<&ExpertRows<Q>>,
        scales: Option<ScaleSplit>,
        sink: impl Fn(String, LaterRead) + 'static,
    ) {
        let Some(rows) = experts else {
            let layer = self.layer.clone();
            batch.add(bytes, move |read| sink(layer, read));
            return;
        };
        let count = rows.groups.count;
        let split = ExpertSplit {
            count,
            tokens: rows.tokens.clone(),
            groups: rows.groups.host.clone(),
            scales,
        };
        let layer = self.layer.clone();
        batch.add(bytes, move |read| {
            let shared = Arc::new(Mutex::new(Deferred::new(move || split_per_expert(read, &split))));
            for g in 0..count {
                let part = shared.clone();
                sink(format!("{layer}.gemm_{g}"), Box::new(move || take_expert(&part, g)));
            }
        });
    }

    /// `observe` of this layer (`experts: None`) or of every expert of a grouped layer, with the
    /// buffers to read back added to `batch` (several observations then share one device read).
    pub(crate) fn observe_into<Q: LowpBackend>(
        &self,
        tensor: TensorKind,
        x: &FloatTensor<Q>,
        quantized: Option<&QuantizedTensor<Q>>,
        experts: Option<&ExpertRows<Q>>,
        batch: &mut ReadBatch<Q>,
    ) -> Result<()> {
        let f = &self.section.features;
        let it = self.iteration;
        if x.shape().num_elements() == 0 {
            return Ok(());
        }
        let labels = experts.map(|e| (e.row_group.clone(), e.groups.count));
        // Where a statistic's read goes: the session's pending statistics.
        let to_stats = |what: StatsRead| {
            let session = self.session.clone();
            move |layer: String, read: LaterRead| {
                session.push_stats(PendingStats {
                    iteration: it,
                    layer,
                    tensor,
                    what: what.clone(),
                    read,
                })
            }
        };
        // The tensor's own statistics. The records of a pass against a quantized copy hold them
        // too (the same fold of the same values beside the error terms), so a tensor measured
        // against its copy takes them from that pass instead of a pass of its own.
        let log_tensor = |batch: &mut ReadBatch<Q>, error_pass: Option<Q::Bytes>| -> Result<()> {
            let Some(l) = f
                .log_tensor_stats
                .as_ref()
                .filter(|l| l.tensors.contains(&tensor) && l.schedule().samples(it))
            else {
                return Ok(());
            };
            let partials = match error_pass {
                Some(p) => p,
                None => Q::stats_tensor(self.data_view::<Q>(tensor, x.clone()), None, labels.clone())?,
            };
            self.add_read(batch, vec![partials], experts, None, to_stats(StatsRead::Tensor(l.stats.clone())));
            Ok(())
        };
        let Some(q) = quantized else {
            return log_tensor(batch, None);
        };
        // The error partials of `q`'s copies that the quantized statistics and the AutoswitchGemm
        // metrics read, computed once per direction, both directions in one pass where the
        // backend decodes the copies itself.
        let quantized_stats = f
            .log_quantized_tensor_stats
            .as_ref()
            .filter(|l| l.tensors.contains(&tensor) && l.schedule().samples(it));
        let metrics = f.autoswitch_gemm.as_ref().filter(|a| a.schedule().samples(it));
        let mut wanted = Vec::new();
        if let Some(l) = quantized_stats {
            wanted.push(Direction::Rowwise);
            if l.columnwise {
                wanted.push(Direction::Columnwise);
            }
        }
        if let Some(a) = metrics {
            for gemm in a.gemms.iter().filter(|g| a.monitored(**g).contains(&tensor)) {
                wanted.push(direction_for(tensor, *gemm));
            }
        }
        let mut directions: Vec<Direction> = Vec::new();
        for d in wanted {
            if !directions.contains(&d) && matches!(q.storage(d), Some(Storage::Quantized(_))) {
                directions.push(d);
            }
        }
        let own = self.error_partials(tensor, x, q, &directions, experts)?;
        let own_partials = |direction: Direction| -> Result<ErrorPartials<Q>> {
            own.iter()
                .find(|(d, _)| *d == direction)
                .map(|(_, p)| p.clone())
                .ok_or_else(|| LowpError::invalid("debug observation", format!("{direction:?}"), "has no quantized copy"))
        };
        if let Some(l) = quantized_stats {
            let mut directions = vec![(Direction::Rowwise, "")];
            if l.columnwise {
                directions.push((Direction::Columnwise, "_columnwise"));
            }
            // (name prefix, the tensor, whether it is `q` itself)
            let mut variants: Vec<(String, QuantizedTensor<Q>, bool)> =
                vec![(String::new(), q.clone(), true)];
            // What-if casts of a grouped tensor would need grouped quantizers: a grouped layer
            // with `what_if` runs its experts one by one (`changes_expert_gemms`).
            for recipe in l.what_if.iter().filter(|_| experts.is_none()) {
                let usage = Usage {
                    rowwise: true,
                    columnwise: l.columnwise,
                };
                let spec = what_if_spec(*recipe, tensor);
                let shadow = quantize(x.clone(), &spec, usage, false, &QuantizeCall::new(0));
                match shadow {
                    Ok(s) => variants.push((format!("{}_", recipe.name()), s, false)),
                    // A shape the what-if format cannot block: nothing to report for it.
                    Err(_) => continue,
                }
            }
            for (prefix, v, is_own) in variants {
                for (direction, suffix) in &directions {
                    let Some(Storage::Quantized(storage)) = v.storage(*direction) else {
                        continue;
                    };
                    let (partials, scales) = if is_own {
                        own_partials(*direction)?
                    } else {
                        self.error_partials(tensor, x, &v, &[*direction], None)?.remove(0).1
                    };
                    let decode = match (&storage.format, scales.is_some()) {
                        (QuantFormat::Nvfp4 { .. }, _) | (_, false) => None,
                        (QuantFormat::Mxfp8 { .. }, true) => Some(ScaleDecode::E8m0),
                        (_, true) => Some(ScaleDecode::F32),
                    };
                    let mut bytes = vec![partials];
                    if let (Some(s), Some(_)) = (scales, decode) {
                        bytes.push(s);
                    }
                    let what = StatsRead::Quantized {
                        stats: l.stats.clone(),
                        prefix: prefix.clone(),
                        suffix,
                        scales: decode,
                    };
                    let split = ScaleSplit {
                        format: storage.format,
                        direction: *direction,
                        cols: q.cols,
                    };
                    self.add_read(batch, bytes, experts, Some(split), to_stats(what));
                }
            }
        }
        if let Some(a) = metrics {
            for gemm in a.gemms.iter().filter(|g| a.monitored(**g).contains(&tensor)) {
                let direction = direction_for(tensor, *gemm);
                if !matches!(q.storage(direction), Some(Storage::Quantized(_))) {
                    continue;
                }
                let (partials, _) = own_partials(direction)?;
                let (session, gemm) = (self.session.clone(), *gemm);
                self.add_read(batch, vec![partials], experts, None, move |layer, read| {
                    session.push_metric(&layer, gemm, it, tensor, read)
                });
            }
        }
        log_tensor(batch, own.first().map(|(_, (partials, _))| partials.clone()))
    }

    /// Partials of `x` against each of `q`'s `directions` copies (with the delayed-scaling
    /// overflow limit for FP8 per-tensor copies, per expert for a grouped tensor), and each
    /// copy's scale bytes.
    fn error_partials<Q: LowpBackend>(
        &self,
        tensor: TensorKind,
        x: &FloatTensor<Q>,
        q: &QuantizedTensor<Q>,
        directions: &[Direction],
        experts: Option<&ExpertRows<Q>>,
    ) -> Result<Vec<(Direction, ErrorPartials<Q>)>> {
        if directions.is_empty() {
            return Ok(Vec::new());
        }
        let mut storages = Vec::new();
        for &d in directions {
            let storage = q.quantized(d)?;
            let scales = match (&storage.format, &storage.scales) {
                (QuantFormat::Fp8Tensor { .. }, StorageScales::TensorScaleInv(s)) => Some(s.clone()),
                (_, StorageScales::BlockF32 { bytes, .. } | StorageScales::BlockBytes { bytes, .. }) => Some(bytes.clone()),
                _ => None,
            };
            storages.push((d, storage, scales));
        }
        let x = self.data_view::<Q>(tensor, Q::float_reshape(x.clone(), Shape::new([q.rows, q.cols])));
        // One pass that decodes the copies itself where the backend has one (FP8 copies on CubeCL
        // backends: no dequantized copy, no launches for the limit, both directions in one read
        // of x), bit-equal to the passes below.
        let grouped = experts.map(|e| (&e.groups, e.row_group.clone()));
        if let Some(sets) = Q::stats_quantization(x.clone(), q, directions, grouped)? {
            return Ok(storages.into_iter().zip(sets).map(|((d, _, scales), p)| (d, (p, scales))).collect());
        }
        let device = Q::float_device(&x);
        let limits = experts.map_or(1, |e| e.groups.count);
        let labels = experts.map(|e| (e.row_group.clone(), e.groups.count));
        let mut out = Vec::new();
        for (direction, storage, scales) in storages {
            let dequantized = match experts {
                Some(e) => Q::grouped_dequantize(q, direction, &e.groups, &e.row_group)?,
                None => Q::quantize_dequantize(q, direction)?,
            };
            let limit = match (&storage.format, &storage.scales) {
                (QuantFormat::Fp8Tensor { fp8 }, StorageScales::TensorScaleInv(s)) => {
                    let scale_inv = Q::bytes_as_float(s, [1, limits]);
                    Q::float_mul_scalar(scale_inv, fp8.max().into())
                }
                _ => infinite::<Q>(limits, &device),
            };
            let dequantized = self.data_view::<Q>(tensor, dequantized);
            let partials = Q::stats_tensor(x.clone(), Some((dequantized, limit)), labels.clone())?;
            out.push((direction, (partials, scales)));
        }
        Ok(out)
    }
}

/// The rows of a grouped layer's tensor, per expert: `row_group` (Int, the expert of each row,
/// `groups.count` for padding rows), the tensor's groups (token groups, or the weights' groups
/// of `out` rows), and the token groups' host copy (which experts got tokens), read when the
/// statistics are logged, a step later, when it has long arrived.
#[derive(Clone, Debug)]
pub struct ExpertRows<Q: LowpBackend> {
    pub row_group: IntTensor<Q>,
    pub groups: Groups<Q>,
    pub tokens: HostCopy<HostGroups>,
}

/// How to find one expert's scales in a grouped representation's scale bytes.
#[derive(Clone, Debug)]
struct ScaleSplit {
    format: QuantFormat,
    direction: Direction,
    cols: usize,
}

/// How one read of a grouped tensor's statistics splits per expert.
struct ExpertSplit {
    count: usize,
    /// Which experts got tokens (the token layout's groups).
    tokens: HostCopy<HostGroups>,
    /// The groups of the tensor's rows (where each expert's block scales lie).
    groups: HostCopy<HostGroups>,
    scales: Option<ScaleSplit>,
}

/// Expert `g`'s part of a read of grouped statistics (each expert's buffers, split in one pass
/// by the first expert to ask): its records of the partials and its scales; nothing for an
/// expert that got no tokens (nothing is then logged for it, as when the experts run one by one).
fn take_expert(shared: &Mutex<Deferred<Vec<Vec<Vec<u8>>>>>, g: usize) -> Result<Vec<Vec<u8>>> {
    let mut split = shared.lock().expect("expert split lock");
    match split.resolve() {
        Ok(parts) => Ok(std::mem::take(&mut parts[g])),
        Err(e) => Err(crate::error::LowpError::invalid("grouped debug statistics read", "failed", e)),
    }
}

fn split_per_expert(read: LaterRead, split: &ExpertSplit) -> Result<Vec<Vec<Vec<u8>>>> {
    let buffers = read()?;
    let tokens = split.tokens.get()?.groups;
    let records = split_partials_by_group(&buffers[0], split.count);
    let groups = match split.scales.as_ref().map(|s| s.format) {
        Some(QuantFormat::Fp8Tensor { .. }) | None => None,
        Some(_) => Some(split.groups.get()?.groups),
    };
    Ok(records
        .into_iter()
        .enumerate()
        .map(|(g, partials)| {
            if tokens.get(g).is_none_or(|t| t.used == 0) {
                return vec![Vec::new()];
            }
            let mut part = vec![partials];
            if let (Some(s), Some(scales)) = (&split.scales, buffers.get(1)) {
                let range = match &groups {
                    None => 4 * g..4 * g + 4,
                    Some(groups) => group_ranges(&s.format, s.direction, s.cols, groups[g]).scales,
                };
                part.push(scales.get(range).map(<[u8]>::to_vec).unwrap_or_default());
            }
            part
        })
        .collect())
}

/// Statistics partials of a tensor against one quantized copy, and the copy's scale bytes.
type ErrorPartials<Q> = (<Q as LowpTypes>::Bytes, Option<<Q as LowpTypes>::Bytes>);

/// `[1, n]` infinite overflow limits (formats without delayed scaling's clipping).
fn infinite<Q: LowpBackend>(n: usize, device: &Q::Device) -> FloatTensor<Q> {
    let bytes = f32::INFINITY.to_le_bytes().repeat(n);
    Q::bytes_as_float(&Q::bytes_from_host(bytes, device), [1, n])
}
