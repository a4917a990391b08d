//! Training text as byte-level tokens: any UTF-8 file, or a built-in deterministic corpus so
//! the example trains offline. Batches are windows at positions drawn from `(seed, step,
//! micro-batch, row)` alone, so the data position of a run is its step number: a resumed run
//! draws exactly the batches the uninterrupted one would have.

use std::path::Path;

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use burn_lowp::error::LowpError;

/// The last `1 / HOLDOUT` of the text is held out for evaluation.
const HOLDOUT: usize = 20;

/// SplitMix64: a stateless mix, so any batch can be drawn without replaying the ones before.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A small sequential generator over [`mix`] for the built-in corpus.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(1);
        (mix(self.0) % n as u64) as usize
    }
    fn pick<'a>(&mut self, words: &[&'a str]) -> &'a str {
        words[self.below(words.len())]
    }
}

#[derive(Debug, Clone)]
pub struct Corpus {
    /// Where the text came from (a path, or "built-in").
    pub source: String,
    bytes: Vec<u8>,
}

/// One micro-batch: `tokens[b, t]` and the next tokens `targets[b, t] = tokens[b, t + 1]`.
pub struct Batch<B: Backend> {
    pub tokens: Tensor<B, 2, Int>,
    pub targets: Tensor<B, 2, Int>,
}

impl Corpus {
    /// Reads a UTF-8 text file (bytes are the tokens, so the vocabulary is 256).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, LowpError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| LowpError::file(path, e))?;
        std::str::from_utf8(&bytes).map_err(|e| LowpError::file(path, format!("not UTF-8 text: {e}")))?;
        Ok(Corpus {
            source: path.display().to_string(),
            bytes,
        })
    }

    /// A deterministic synthetic corpus of about `len` bytes with structure a small model can
    /// learn at several levels: spelling of a closed vocabulary, sentence templates with
    /// agreement, and arithmetic facts whose answers follow from the question.
    pub fn built_in(len: usize) -> Self {
        const NAMES: &[&str] = &["Ada", "Brook", "Cyrus", "Dana", "Emil", "Farah", "Goran", "Hana", "Ivo", "Jun"];
        const ADJECTIVES: &[&str] = &["small", "bright", "quiet", "heavy", "rapid", "gentle", "narrow", "ancient"];
        const NOUNS: &[&str] = &["river", "engine", "garden", "signal", "bridge", "lantern", "market", "tensor"];
        const VERBS: &[(&str, &str)] = &[
            ("repairs", "repaired"), ("watches", "watched"), ("paints", "painted"), ("measures", "measured"),
            ("follows", "followed"), ("builds", "built"), ("carries", "carried"), ("finds", "found"),
        ];
        const PLACES: &[&str] = &["near the hill", "by the sea", "in the old town", "under the bridge", "at dawn"];
        let mut rng = Rng(0x5eed);
        let mut text = String::with_capacity(len + 128);
        while text.len() < len {
            let sentence = match rng.below(4) {
                0 | 1 => {
                    let (present, past) = VERBS[rng.below(VERBS.len())];
                    let verb = if rng.below(2) == 0 { present } else { past };
                    format!(
                        "{} {} the {} {} {}.",
                        rng.pick(NAMES),
                        verb,
                        rng.pick(ADJECTIVES),
                        rng.pick(NOUNS),
                        rng.pick(PLACES)
                    )
                }
                2 => {
                    let (a, b) = (rng.below(50), rng.below(50));
                    format!("{a} plus {b} is {}.", a + b)
                }
                _ => {
                    let start = rng.below(90);
                    let step = 1 + rng.below(4);
                    let seq: Vec<String> = (0..5).map(|i| (start + i * step).to_string()).collect();
                    format!("count by {step}: {}.", seq.join(", "))
                }
            };
            text.push_str(&sentence);
            text.push(if rng.below(6) == 0 { '\n' } else { ' ' });
        }
        Corpus {
            source: "built-in".into(),
            bytes: text.into_bytes(),
        }
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Checks that both splits hold at least one window of `seq_len + 1` bytes.
    pub fn check_fits(&self, seq_len: usize) -> Result<(), LowpError> {
        let need = (seq_len + 2) * HOLDOUT;
        if self.bytes.len() < need {
            return Err(LowpError::invalid(
                format!("data {}", self.source),
                format!("{} bytes", self.bytes.len()),
                format!("must hold at least {need} bytes for seq_len {seq_len} (training and held-out windows)"),
            ));
        }
        Ok(())
    }

    fn split(&self, held_out: bool) -> &[u8] {
        let cut = self.bytes.len() - self.bytes.len() / HOLDOUT;
        match held_out {
            false => &self.bytes[..cut],
            true => &self.bytes[cut..],
        }
    }

    fn windows<B: Backend>(&self, held_out: bool, starts: impl Fn(usize) -> u64, rows: usize, seq_len: usize, device: &B::Device) -> Batch<B> {
        let text = self.split(held_out);
        let positions = (text.len() - seq_len - 1) as u64;
        let mut tokens = Vec::with_capacity(rows * seq_len);
        let mut targets = Vec::with_capacity(rows * seq_len);
        for row in 0..rows {
            let at = (starts(row) % positions) as usize;
            tokens.extend(text[at..at + seq_len].iter().map(|&b| b as i64));
            targets.extend(text[at + 1..at + seq_len + 1].iter().map(|&b| b as i64));
        }
        let tensor = |v: Vec<i64>| Tensor::from_data(TensorData::new(v, [rows, seq_len]), device);
        Batch {
            tokens: tensor(tokens),
            targets: tensor(targets),
        }
    }

    /// Training micro-batch `micro` of step `step` (the tests' entry; training takes a rank's rows).
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn batch<B: Backend>(&self, seed: u64, step: usize, micro: usize, rows: usize, seq_len: usize, device: &B::Device) -> Batch<B> {
        self.batch_rows(seed, step, micro, 0, rows, seq_len, device)
    }

    /// Rows `first_row..first_row + rows` of training micro-batch `micro` of step `step`: a data
    /// parallel rank's shard. The shards of all ranks, in rank order, are the one-GPU batch of
    /// their total rows, row for row.
    #[allow(clippy::too_many_arguments)]
    pub fn batch_rows<B: Backend>(&self, seed: u64, step: usize, micro: usize, first_row: usize, rows: usize, seq_len: usize, device: &B::Device) -> Batch<B> {
        let base = mix(seed ^ mix(((step as u64) << 20) ^ micro as u64));
        self.windows(false, |row| mix(base ^ (first_row + row) as u64), rows, seq_len, device)
    }

    /// Rows `first_row..first_row + rows` of held-out batch `index` (the same for every seed and
    /// recipe): a data parallel rank's shard, as `batch_rows` for training; all rows on one GPU.
    pub fn eval_batch_rows<B: Backend>(&self, index: usize, first_row: usize, rows: usize, seq_len: usize, device: &B::Device) -> Batch<B> {
        let base = mix(0xe7a1 ^ index as u64);
        self.windows(true, |row| mix(base ^ (first_row + row) as u64), rows, seq_len, device)
    }
}
