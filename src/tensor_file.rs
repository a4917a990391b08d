//! safetensors files in and out: high-precision tensors read as [`HostMatrix`], quantized fields
//! written as raw bytes and f32.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};

use crate::error::{LowpError, Result};
use crate::format::{HostMatrix, InputDtype};

/// A safetensors file held in memory.
pub struct TensorFile {
    path: PathBuf,
    bytes: Vec<u8>,
}

/// One tensor's raw contents.
pub struct RawTensor {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl TensorFile {
    pub fn open(path: impl AsRef<Path>) -> Result<TensorFile> {
        let path = path.as_ref().to_path_buf();
        let bytes = std::fs::read(&path).map_err(|e| LowpError::file(&path, e))?;
        let file = TensorFile { path, bytes };
        file.parse()?; // fail here, on open, if the header is bad
        Ok(file)
    }

    fn parse(&self) -> Result<SafeTensors<'_>> {
        SafeTensors::deserialize(&self.bytes)
            .map_err(|e| LowpError::file(&self.path, format!("not a safetensors file: {e}")))
    }

    /// Tensor names, sorted.
    pub fn names(&self) -> Result<Vec<String>> {
        let mut names: Vec<String> = self
            .parse()?
            .names()
            .into_iter()
            .map(String::from)
            .collect();
        names.sort();
        Ok(names)
    }

    pub fn raw(&self, name: &str) -> Result<RawTensor> {
        let st = self.parse()?;
        let view = st.tensor(name).map_err(|_| {
            let mut names = st.names();
            names.sort();
            let mut available = names.iter().take(8).copied().collect::<Vec<_>>().join(", ");
            if names.len() > 8 {
                available.push_str(&format!(", ... ({} tensors)", names.len()));
            }
            LowpError::MissingTensor {
                tensor: name.to_string(),
                file: self.path.display().to_string(),
                available,
            }
        })?;
        Ok(RawTensor {
            dtype: view.dtype(),
            shape: view.shape().to_vec(),
            data: view.data().to_vec(),
        })
    }

    /// Reads an f32, f16 or bf16 tensor, flattened to 2D `[prod(shape[..-1]), shape[-1]]`.
    pub fn read_matrix(&self, name: &str) -> Result<HostMatrix> {
        let raw = self.raw(name)?;
        let (dtype, values): (InputDtype, Vec<f32>) = match raw.dtype {
            Dtype::F32 => (
                InputDtype::F32,
                raw.data
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            ),
            Dtype::F16 => (
                InputDtype::F16,
                raw.data
                    .chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
            ),
            Dtype::BF16 => (
                InputDtype::BF16,
                raw.data
                    .chunks_exact(2)
                    .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
            ),
            other => {
                return Err(LowpError::Dtype {
                    tensor: name.to_string(),
                    dtype: format!("{other:?}"),
                    supported: "quantizers read F32, F16 and BF16".to_string(),
                })
            }
        };
        HostMatrix::from_shape(name, &raw.shape, dtype, values)
    }

    /// Reads a U8 tensor's bytes (for checking quantized outputs).
    pub fn read_u8(&self, name: &str) -> Result<(Vec<usize>, Vec<u8>)> {
        let raw = self.raw(name)?;
        expect_dtype(name, raw.dtype, Dtype::U8)?;
        Ok((raw.shape, raw.data))
    }

    /// Reads an F32 tensor.
    pub fn read_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let raw = self.raw(name)?;
        expect_dtype(name, raw.dtype, Dtype::F32)?;
        let values = raw
            .data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Ok((raw.shape, values))
    }

    /// The file's `__metadata__` map (empty if it has none).
    pub fn metadata(&self) -> Result<HashMap<String, String>> {
        let (_, metadata) = SafeTensors::read_metadata(&self.bytes)
            .map_err(|e| LowpError::file(&self.path, format!("not a safetensors file: {e}")))?;
        Ok(metadata.metadata().clone().unwrap_or_default())
    }
}

fn expect_dtype(name: &str, got: Dtype, want: Dtype) -> Result<()> {
    if got != want {
        return Err(LowpError::Dtype {
            tensor: name.to_string(),
            dtype: format!("{got:?}"),
            supported: format!("expected {want:?}"),
        });
    }
    Ok(())
}

/// Collects tensors and writes them as one safetensors file.
#[derive(Default)]
pub struct TensorWriter {
    tensors: Vec<(String, RawTensor)>,
    metadata: HashMap<String, String>,
}

impl TensorWriter {
    pub fn add_u8(&mut self, name: &str, shape: Vec<usize>, data: Vec<u8>) {
        self.add(name, Dtype::U8, shape, data);
    }

    pub fn add_f32(&mut self, name: &str, shape: Vec<usize>, values: &[f32]) {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add(name, Dtype::F32, shape, data);
    }

    fn add(&mut self, name: &str, dtype: Dtype, shape: Vec<usize>, data: Vec<u8>) {
        self.tensors
            .push((name.to_string(), RawTensor { dtype, shape, data }));
    }

    pub fn set_metadata(&mut self, key: &str, value: impl ToString) {
        self.metadata.insert(key.to_string(), value.to_string());
    }

    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let views = self
            .tensors
            .iter()
            .map(|(name, t)| {
                safetensors::tensor::TensorView::new(t.dtype, t.shape.clone(), &t.data)
                    .map(|v| (name.clone(), v))
                    .map_err(|e| LowpError::file(path, format!("tensor `{name}`: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let bytes = safetensors::serialize(views, Some(self.metadata.clone()))
            .map_err(|e| LowpError::file(path, e))?;
        std::fs::write(path, bytes).map_err(|e| LowpError::file(path, e))
    }
}
