//! CubeCL's CUDA stream, where the CubeCL build has it. The repository's vendored `cubecl-cuda`
//! adds an inherent `CudaServer::stream_for_external_work`; the published 0.10.0 crate, which a
//! crate depending on burn-lowp gets (`[patch.crates-io]` applies in the root workspace only),
//! does not. `ExternalStream` gives the published server a method of the same name that says
//! the stream is unavailable: Rust resolves a method call to an inherent method before a trait's,
//! so with the patch the call below reaches CubeCL's method, without it ours, and
//! `ExternalWork` turns either return type into one. Without the stream, GEMMs are ordered by
//! the device-flags handshake (`StreamOrdering::DeviceFlags`).

use burn_lowp_kernels::cubecl::server::Binding;
use burn_lowp_kernels::cubecl::stream_id::StreamId;
use cudarc::driver::sys as cuda;

use super::run::CudaServer;
use crate::error::{LowpError, Result};

/// The published `CudaServer`'s stand-in for the vendored crate's inherent method (shadowed by
/// it when the patch applies, and then never called: hence the `dead_code` allowance).
#[allow(dead_code)]
trait ExternalStream {
    fn stream_for_external_work(&mut self, stream_id: StreamId, bindings: Vec<Binding>) -> Unavailable;
}

impl ExternalStream for CudaServer {
    fn stream_for_external_work(&mut self, _: StreamId, _: Vec<Binding>) -> Unavailable {
        Unavailable
    }
}

/// What the stand-in returns: this CubeCL build does not expose its stream.
#[allow(dead_code)]
struct Unavailable;

/// The return type of whichever `stream_for_external_work` the call resolves to.
trait ExternalWork {
    /// Whether the stream is available at all (known from the type alone).
    const AVAILABLE: bool;
    /// CubeCL's stream and the bindings' device pointers; `None` if unavailable.
    fn into_stream(self) -> Option<Result<(cuda::CUstream, Vec<u64>)>>;
}

impl ExternalWork for Unavailable {
    const AVAILABLE: bool = false;
    fn into_stream(self) -> Option<Result<(cuda::CUstream, Vec<u64>)>> {
        None
    }
}

impl<E: std::fmt::Debug> ExternalWork for std::result::Result<(cuda::CUstream, Vec<u64>), E> {
    const AVAILABLE: bool = true;
    fn into_stream(self) -> Option<Result<(cuda::CUstream, Vec<u64>)>> {
        Some(self.map_err(|e| LowpError::invalid("CubeCL", "stream for external work", format!("{e:?}"))))
    }
}

/// The call both builds compile: the inherent method when the vendored crate is in, else ours.
fn external_work(
    server: &mut CudaServer,
    stream_id: StreamId,
    bindings: Vec<Binding>,
) -> impl ExternalWork {
    server.stream_for_external_work(stream_id, bindings)
}

fn available<W: ExternalWork>(_: fn(&mut CudaServer, StreamId, Vec<Binding>) -> W) -> bool {
    W::AVAILABLE
}

/// Whether this build's CubeCL names its CUDA stream (the vendored `cubecl-cuda` is in), so that
/// GEMMs can be ordered with events (`StreamOrdering::CubeclStream`).
pub fn cubecl_stream_available() -> bool {
    available(external_work)
}

/// The CUDA stream CubeCL runs `stream_id`'s work on, and the device pointers of `bindings`
/// resolved for it (see the vendored `CudaServer::stream_for_external_work`). An error if this
/// build's CubeCL does not expose it (callers check `cubecl_stream_available` first).
pub(crate) fn stream_for_external_work(
    server: &mut CudaServer,
    stream_id: StreamId,
    bindings: Vec<Binding>,
) -> Result<(cuda::CUstream, Vec<u64>)> {
    external_work(server, stream_id, bindings).into_stream().unwrap_or_else(|| {
        Err(LowpError::invalid(
            "stream ordering",
            "cubecl-stream",
            "this build's cubecl-cuda does not expose its CUDA stream (the published 0.10.0 crate; \
             see the README's [patch.crates-io]); GEMMs are ordered by device flags",
        ))
    })
}
