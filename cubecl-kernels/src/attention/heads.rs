//! Attention's head layout in one pass each way. A fused QKV projection gives token rows
//! `x [batch · seq, parts · heads · head]` (row `b · seq + s`, column `(p · heads + h) · head + d`
//! for part p: q, k, v); attention wants each part as `[batch · heads, seq, head]` (row
//! `(b · heads + h) · seq + s`). Burn gets there with a reshape, a dimension swap and a narrow
//! per part, which copy forward and, in backward, fill zeros, assign slices and add the three
//! parts' gradients over the whole QKV tensor.
//!
//! * `split_heads` writes the parts apart, rotating the first `rope_parts` of them (RoPE, as the
//!   `rope` kernel does: `rope::rotate_pair`, position `s`) on the way;
//! * `merge_heads` is its transpose: the parts back into token rows, the first `rope_parts`
//!   rotated backwards (`inverse`: RoPE's gradient), which is also attention's output projection
//!   layout (one part, no rotation).
//!
//! One unit moves one element pair; rotated parts compute in f32 and round to the dtype once,
//! the others are copied word for word. Where a head is whole 16-byte vectors (bf16 `head % 8 ==
//! 0`, f32 `head % 4 == 0`: every model shape) a unit moves one vector instead (four bf16 pairs,
//! two f32 pairs), the same values bit for bit with a quarter of the index arithmetic a byte: the
//! pair kernels moved `[8192, 3 · 2048]` bf16 at about 1.9 TB/s on an H200 (2026-11-28).

use crate::attention::rope::rotate_pair;
use crate::util::buffers::arg;
use crate::util::elements::ElemKind;
use crate::util::error::KernelError;
use crate::util::matrix::INPUT_VECTOR;
use crate::util::pairs::{load_pair, pair_word, store_pair, word_pair};

use cubecl::prelude::*;
use cubecl::server::Handle;

/// Units per cube.
pub const HEADS_UNITS: usize = 256;

/// Where unit `pair` of a split or merge works: its part p, its pair r within the part
/// (elements `2r, 2r + 1` of the part's `[batch · heads, seq, head]` layout), the pair's element
/// index in the token rows, and its frequency entry (sequence position s: `freq[s, 2·(r % half)]`).
#[cube]
fn place(
    pair: usize,
    pairs_per_part: usize,
    parts: usize,
    heads: usize,
    seq: usize,
    half: usize,
) -> (usize, usize, usize, usize) {
    let p = pair / pairs_per_part;
    let r = pair % pairs_per_part;
    let d2 = r % half;
    let t = r / half;
    let s = t % seq;
    let bh = t / seq;
    let h = bh % heads;
    let b = bh / heads;
    let row = ((((b * seq + s) * parts + p) * heads + h) * half + d2) * 2;
    (p, r, row, (s * half + d2) * 4)
}

/// Moves the pair at element `from` of `input` to element `to` of `out`, rotated when `rotate`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn move_pair(
    input: &Array<u32>,
    from: usize,
    out: &mut Array<u32>,
    to: usize,
    rotate: bool,
    freq: &Array<f32>,
    f: usize,
    #[comptime] kind: ElemKind,
    #[comptime] inverse: bool,
) {
    if rotate {
        let (a, b) = load_pair(input, from, kind);
        let (ya, yb) = rotate_pair(a, b, freq, f, inverse);
        store_pair(out, to, ya, yb, kind);
    } else {
        match kind {
            ElemKind::F32 => {
                out[to] = input[from];
                out[to + 1] = input[from + 1];
            }
            _ => {
                out[to / 2] = input[from / 2];
            }
        }
    }
}

/// The shape of a head split: token rows `[batch · seq, parts · heads · head]` and `parts` parts
/// `[batch · heads, seq, head]`, the first `rope_parts` rotated with frequencies for positions
/// `0..seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadLayout {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head: usize,
    pub parts: usize,
    pub rope_parts: usize,
}

impl HeadLayout {
    fn check(&self, freq_rows: Option<usize>) -> Result<(), KernelError> {
        let HeadLayout { batch, seq, heads, head, parts, rope_parts } = *self;
        let rope_ok = rope_parts == 0 || freq_rows.is_some_and(|rows| rows >= seq);
        if batch == 0 || seq == 0 || heads == 0 || head == 0 || head % 2 != 0 || !(1..=3).contains(&parts) || rope_parts > parts || !rope_ok {
            return Err(KernelError {
                value: format!(
                    "batch {batch}, seq {seq}, {heads} heads of {head}, {parts} parts ({rope_parts} rotated), frequencies for {freq_rows:?} positions"
                ),
                rule: "a head split has 1 to 3 parts of heads of an even size, and frequencies for every position of the rotated ones".into(),
            });
        }
        Ok(())
    }

    fn pairs_per_part(&self) -> usize {
        self.batch * self.seq * self.heads * self.head / 2
    }

    /// Bytes of one part.
    pub fn part_bytes(&self, kind: ElemKind) -> usize {
        self.pairs_per_part() * 2 * kind.bytes()
    }

    /// The frequency table's argument, or a buffer of its own where no part rotates (wgpu
    /// rejects a buffer bound both read-only and writable in one dispatch).
    fn freq_arg<R: Runtime>(&self, client: &ComputeClient<R>, freq: Option<(&Handle, usize)>) -> ArrayArg<R> {
        match freq {
            Some((handle, rows)) => arg(handle, rows * self.head * 2),
            None => arg(&client.empty(4), 1),
        }
    }

    /// 16-byte vectors a head holds, where a head is whole vectors (the vector kernels).
    fn head_vectors(&self, kind: ElemKind) -> Option<usize> {
        let bytes = self.head * kind.bytes();
        (bytes % (INPUT_VECTOR * 4) == 0).then_some(bytes / (INPUT_VECTOR * 4))
    }

    fn vectors_per_part(&self, head_vectors: usize) -> usize {
        self.batch * self.seq * self.heads * head_vectors
    }

    fn vector_cubes<R: Runtime>(&self, client: &ComputeClient<R>, head_vectors: usize) -> CubeCount {
        let units = self.vectors_per_part(head_vectors) * self.parts;
        cubecl::server::CubeCountSelection::new(client, units.div_ceil(HEADS_UNITS).max(1) as u32).cube_count()
    }

    fn cubes<R: Runtime>(&self, client: &ComputeClient<R>) -> CubeCount {
        let units = self.pairs_per_part() * self.parts;
        cubecl::server::CubeCountSelection::new(client, units.div_ceil(HEADS_UNITS).max(1) as u32).cube_count()
    }
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn split_heads_kernel(
    x: &Array<u32>,
    freq: &Array<f32>,
    out0: &mut Array<u32>,
    out1: &mut Array<u32>,
    out2: &mut Array<u32>,
    pairs_per_part: usize,
    parts: usize,
    rope_parts: usize,
    heads: usize,
    seq: usize,
    half: usize,
    #[comptime] kind: ElemKind,
) {
    let pair = CUBE_POS as usize * HEADS_UNITS + UNIT_POS as usize;
    if pair < pairs_per_part * parts {
        let (p, r, from, f) = place(pair, pairs_per_part, parts, heads, seq, half);
        let rotate = p < rope_parts;
        if p == 0 {
            move_pair(x, from, out0, 2 * r, rotate, freq, f, kind, false);
        } else if p == 1 {
            move_pair(x, from, out1, 2 * r, rotate, freq, f, kind, false);
        } else {
            move_pair(x, from, out2, 2 * r, rotate, freq, f, kind, false);
        }
    }
}

/// The parts of token rows `x` (`layout`'s `[batch · seq, parts · heads · head]`, contiguous) as
/// `[batch · heads, seq, head]` buffers, the first `rope_parts` rotated with `freq`
/// (`[max_seq, head, 2]` f32 and its row count, as `rope` takes them).
pub fn split_heads<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Handle,
    kind: ElemKind,
    freq: Option<(&Handle, usize)>,
    layout: HeadLayout,
) -> Result<Vec<Handle>, KernelError> {
    layout.check(freq.map(|(_, rows)| rows))?;
    let part_words = layout.part_bytes(kind).div_ceil(4);
    let outs: Vec<Handle> = (0..layout.parts).map(|_| client.empty(part_words * 4)).collect();
    // Parts past `parts` bind buffers of their own.
    let out = |p: usize| match outs.get(p) {
        Some(h) => arg(h, part_words),
        None => arg(&client.empty(4), 1),
    };
    let freq_arg = layout.freq_arg(client, freq);
    if let Some(head_vectors) = layout.head_vectors(kind) {
        let vector_out = |p: usize| match outs.get(p) {
            Some(h) => arg(h, part_words),
            None => arg(&client.empty(16), 4),
        };
        unsafe {
            split_heads_vector_kernel::launch_unchecked::<R>(
                client,
                layout.vector_cubes(client, head_vectors),
                CubeDim::new_1d(HEADS_UNITS as u32),
                INPUT_VECTOR,
                arg(x, part_words * layout.parts),
                freq_arg,
                vector_out(0),
                vector_out(1),
                vector_out(2),
                layout.vectors_per_part(head_vectors),
                layout.parts,
                layout.rope_parts,
                layout.heads,
                layout.seq,
                head_vectors,
                layout.head / 2,
                kind,
            )
        };
        return Ok(outs);
    }
    unsafe {
        split_heads_kernel::launch_unchecked::<R>(
            client,
            layout.cubes(client),
            CubeDim::new_1d(HEADS_UNITS as u32),
            arg(x, part_words * layout.parts),
            freq_arg,
            out(0),
            out(1),
            out(2),
            layout.pairs_per_part(),
            layout.parts,
            layout.rope_parts,
            layout.heads,
            layout.seq,
            layout.head / 2,
            kind,
        )
    };
    Ok(outs)
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn merge_heads_kernel(
    in0: &Array<u32>,
    in1: &Array<u32>,
    in2: &Array<u32>,
    freq: &Array<f32>,
    out: &mut Array<u32>,
    pairs_per_part: usize,
    parts: usize,
    rope_parts: usize,
    heads: usize,
    seq: usize,
    half: usize,
    #[comptime] kind: ElemKind,
) {
    let pair = CUBE_POS as usize * HEADS_UNITS + UNIT_POS as usize;
    if pair < pairs_per_part * parts {
        let (p, r, to, f) = place(pair, pairs_per_part, parts, heads, seq, half);
        let rotate = p < rope_parts;
        if p == 0 {
            move_pair(in0, 2 * r, out, to, rotate, freq, f, kind, true);
        } else if p == 1 {
            move_pair(in1, 2 * r, out, to, rotate, freq, f, kind, true);
        } else {
            move_pair(in2, 2 * r, out, to, rotate, freq, f, kind, true);
        }
    }
}

/// `split_heads` transposed: the `[batch · heads, seq, head]` parts back into token rows
/// `[batch · seq, parts · heads · head]`, the first `rope_parts` rotated backwards.
pub fn merge_heads<R: Runtime>(
    client: &ComputeClient<R>,
    parts: &[&Handle],
    kind: ElemKind,
    freq: Option<(&Handle, usize)>,
    layout: HeadLayout,
) -> Result<Handle, KernelError> {
    layout.check(freq.map(|(_, rows)| rows))?;
    if parts.len() != layout.parts {
        return Err(KernelError {
            value: format!("{} buffers for {} parts", parts.len(), layout.parts),
            rule: "one buffer per part".into(),
        });
    }
    let part_words = layout.part_bytes(kind).div_ceil(4);
    let out = client.empty(part_words * 4 * layout.parts);
    let input = |p: usize| match parts.get(p) {
        Some(h) => arg(h, part_words),
        None => arg(&client.empty(4), 1),
    };
    let freq_arg = layout.freq_arg(client, freq);
    if let Some(head_vectors) = layout.head_vectors(kind) {
        let vector_input = |p: usize| match parts.get(p) {
            Some(h) => arg(h, part_words),
            None => arg(&client.empty(16), 4),
        };
        unsafe {
            merge_heads_vector_kernel::launch_unchecked::<R>(
                client,
                layout.vector_cubes(client, head_vectors),
                CubeDim::new_1d(HEADS_UNITS as u32),
                INPUT_VECTOR,
                vector_input(0),
                vector_input(1),
                vector_input(2),
                freq_arg,
                arg(&out, part_words * layout.parts),
                layout.vectors_per_part(head_vectors),
                layout.parts,
                layout.rope_parts,
                layout.heads,
                layout.seq,
                head_vectors,
                layout.head / 2,
                kind,
            )
        };
        return Ok(out);
    }
    unsafe {
        merge_heads_kernel::launch_unchecked::<R>(
            client,
            layout.cubes(client),
            CubeDim::new_1d(HEADS_UNITS as u32),
            input(0),
            input(1),
            input(2),
            freq_arg,
            arg(&out, part_words * layout.parts),
            layout.pairs_per_part(),
            layout.parts,
            layout.rope_parts,
            layout.heads,
            layout.seq,
            layout.head / 2,
            kind,
        )
    };
    Ok(out)
}

/// `place` for the vector kernels: unit `q`'s part p, its vector r within the part, the vector's
/// index in the token rows, and the frequency entry of its first pair (the next pairs' follow
/// 4 floats apart).
#[cube]
fn place_vector(
    q: usize,
    vectors_per_part: usize,
    parts: usize,
    heads: usize,
    seq: usize,
    head_vectors: usize,
    half: usize,
    #[comptime] pairs_per_vector: usize,
) -> (usize, usize, usize, usize) {
    let p = q / vectors_per_part;
    let r = q % vectors_per_part;
    let dv = r % head_vectors;
    let t = r / head_vectors;
    let s = t % seq;
    let bh = t / seq;
    let h = bh % heads;
    let b = bh / heads;
    let row = (((b * seq + s) * parts + p) * heads + h) * head_vectors + dv;
    (p, r, row, (s * half + dv * pairs_per_vector) * 4)
}

/// `move_pair` for a vector: the vector at `from` of `input` to `to` of `out`, each pair rotated
/// when `rotate` (frequencies from entry `f`), word for word otherwise.
#[cube]
#[allow(clippy::too_many_arguments)]
fn move_vector<N: Size>(
    input: &Array<Vector<u32, N>>,
    from: usize,
    out: &mut Array<Vector<u32, N>>,
    to: usize,
    rotate: bool,
    freq: &Array<f32>,
    f: usize,
    #[comptime] kind: ElemKind,
    #[comptime] inverse: bool,
) {
    let words = input[from];
    if rotate {
        let mut packed = Vector::<u32, N>::empty();
        if comptime![kind == ElemKind::F32] {
            #[unroll]
            for i in 0..2usize {
                let a = f32::reinterpret(words[2 * i]);
                let b = f32::reinterpret(words[2 * i + 1]);
                let (ya, yb) = rotate_pair(a, b, freq, f + 4 * i, inverse);
                packed[2 * i] = u32::reinterpret(ya);
                packed[2 * i + 1] = u32::reinterpret(yb);
            }
        } else {
            #[unroll]
            for w in 0..INPUT_VECTOR {
                let (a, b) = word_pair(words[w], kind);
                let (ya, yb) = rotate_pair(a, b, freq, f + 4 * w, inverse);
                packed[w] = pair_word(ya, yb, kind);
            }
        }
        out[to] = packed;
    } else {
        out[to] = words;
    }
}

/// `split_heads_kernel` moving one 16-byte vector a unit (`head_vectors` a head).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn split_heads_vector_kernel<N: Size>(
    x: &Array<Vector<u32, N>>,
    freq: &Array<f32>,
    out0: &mut Array<Vector<u32, N>>,
    out1: &mut Array<Vector<u32, N>>,
    out2: &mut Array<Vector<u32, N>>,
    vectors_per_part: usize,
    parts: usize,
    rope_parts: usize,
    heads: usize,
    seq: usize,
    head_vectors: usize,
    half: usize,
    #[comptime] kind: ElemKind,
) {
    let q = CUBE_POS as usize * HEADS_UNITS + UNIT_POS as usize;
    if q < vectors_per_part * parts {
        let pairs_per_vector = comptime![INPUT_VECTOR * 2 / kind.bytes()];
        let (p, r, from, f) = place_vector(q, vectors_per_part, parts, heads, seq, head_vectors, half, pairs_per_vector);
        let rotate = p < rope_parts;
        if p == 0 {
            move_vector::<N>(x, from, out0, r, rotate, freq, f, kind, false);
        } else if p == 1 {
            move_vector::<N>(x, from, out1, r, rotate, freq, f, kind, false);
        } else {
            move_vector::<N>(x, from, out2, r, rotate, freq, f, kind, false);
        }
    }
}

/// `merge_heads_kernel` moving one 16-byte vector a unit.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn merge_heads_vector_kernel<N: Size>(
    in0: &Array<Vector<u32, N>>,
    in1: &Array<Vector<u32, N>>,
    in2: &Array<Vector<u32, N>>,
    freq: &Array<f32>,
    out: &mut Array<Vector<u32, N>>,
    vectors_per_part: usize,
    parts: usize,
    rope_parts: usize,
    heads: usize,
    seq: usize,
    head_vectors: usize,
    half: usize,
    #[comptime] kind: ElemKind,
) {
    let q = CUBE_POS as usize * HEADS_UNITS + UNIT_POS as usize;
    if q < vectors_per_part * parts {
        let pairs_per_vector = comptime![INPUT_VECTOR * 2 / kind.bytes()];
        let (p, r, to, f) = place_vector(q, vectors_per_part, parts, heads, seq, head_vectors, half, pairs_per_vector);
        let rotate = p < rope_parts;
        if p == 0 {
            move_vector::<N>(in0, r, out, to, rotate, freq, f, kind, true);
        } else if p == 1 {
            move_vector::<N>(in1, r, out, to, rotate, freq, f, kind, true);
        } else {
            move_vector::<N>(in2, r, out, to, rotate, freq, f, kind, true);
        }
    }
}
