//! The algorithm of a new GEMM shape: the tuning table's (`gemm_tuning`) where cuBLASLt accepts
//! it, else cuBLASLt's heuristic candidates timed on the GEMM itself, the fastest kept and
//! recorded in the table.

use std::ffi::c_void;

use cudarc::cublaslt::{result as lt, sys as lts};
use cudarc::driver::sys as cuda;

use super::instance::{driver_error, lt_error, CublasLt};
use super::plan::LtGemm;
use crate::backend::gemm_tuning;
use crate::error::{LowpError, Result};

impl CublasLt {
    /// The algorithm for a new GEMM shape: the tuning table's (`gemm_tuning`: a loaded file or
    /// an earlier timing) if it holds one that cuBLASLt accepts for this GEMM; else cuBLASLt's
    /// heuristic proposes up to `CANDIDATES`, each is timed on this very GEMM (a warm-up run each,
    /// then `TIMED_RUNS` rounds of one run of every candidate between two events; its best run
    /// counts), and the fastest is kept and recorded in the table. Every
    /// run writes the same D (`A·B`, or `A·B + C` from another buffer), so the result is the same
    /// whichever ran last. One host wait per timed shape. `LOWP_GEMM_AUTOTUNE=0` keeps the
    /// heuristic's first choice (what TE does); `LOWP_GEMM_AUTOTUNE_LOG=1` prints each choice
    /// (with the candidates' times) to stderr.
    pub(super) unsafe fn choose_algo(
        &mut self,
        lane: usize,
        desc: lts::cublasLtMatmulDesc_t,
        g: &LtGemm,
        a: lts::cublasLtMatrixLayout_t,
        b: lts::cublasLtMatrixLayout_t,
        d: lts::cublasLtMatrixLayout_t,
    ) -> Result<lts::cublasLtMatmulAlgo_t> {
        const CANDIDATES: usize = 8;
        const TIMED_RUNS: usize = 3;
        let timed = g.autotune && std::env::var("LOWP_GEMM_AUTOTUNE").as_deref() != Ok("0");
        let log = std::env::var_os("LOWP_GEMM_AUTOTUNE_LOG").is_some();
        let key = format!("{} {:?}", self.tuning_prefix, g.plan_key());
        if let Some(data) = gemm_tuning::tuned(&key).filter(|_| timed) {
            let algo = lts::cublasLtMatmulAlgo_t { data };
            if unsafe { self.accepts(desc, a, b, d, &algo) } {
                if log {
                    eprintln!("lowp-autotune {:?} -> the tuning table's", g.plan_key());
                }
                return Ok(algo);
            }
        }
        let pref = lt::create_matmul_pref().map_err(lt_error("create preference"))?;
        let bytes = self.workspace_size as u64;
        let mut results: [lts::cublasLtMatmulHeuristicResult_t; CANDIDATES] =
            unsafe { std::mem::zeroed() };
        let mut count: std::ffi::c_int = 0;
        let status = unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                lts::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &bytes as *const u64 as *const c_void,
                8,
            )
            .map_err(lt_error("set preference"))
            .and_then(|_| {
                lts::cublasLtMatmulAlgoGetHeuristic(
                    self.handle,
                    desc,
                    a,
                    b,
                    d,
                    d,
                    pref,
                    CANDIDATES as std::ffi::c_int,
                    results.as_mut_ptr(),
                    &mut count,
                )
                .result()
                .map_err(lt_error("algorithm heuristic"))
            })
        };
        let _ = unsafe { lt::destroy_matmul_pref(pref) };
        status?;
        let candidates: Vec<_> = results[..count.max(0) as usize]
            .iter()
            .filter(|r| r.state == lts::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .map(|r| r.algo)
            .collect();
        let Some(&first) = candidates.first() else {
            return Err(LowpError::invalid(
                "cuBLASLt",
                "no cuBLASLt algorithm for this GEMM",
                format!("{g:?}"),
            ));
        };
        if candidates.len() == 1 || !timed {
            return Ok(first);
        }
        crate::backend::host_sync::record_gemm_autotune();
        let timing = Some(cuda::CUevent_flags::CU_EVENT_DEFAULT);
        let stream = self.lanes[lane].stream.clone();
        // A warm-up run of each candidate, then rounds of one timed run of every candidate: a
        // GPU at its power limit slows down within a second of back-to-back GEMMs, so timing
        // the candidates one after the other favoured the first ones (an H100's clock goes
        // from 1980 to 1380-1500 MHz; `benches/results/turns-h100/`). Each keeps its best run.
        let candidates: Vec<_> = candidates
            .into_iter()
            .filter(|algo| unsafe { self.matmul(lane, desc, g, algo, a, b, d) }.is_ok())
            .collect();
        let mut events = Vec::new();
        for _ in 0..TIMED_RUNS {
            for (index, algo) in candidates.iter().enumerate() {
                let start = stream.record_event(timing).map_err(driver_error("event"))?;
                let ran = unsafe { self.matmul(lane, desc, g, algo, a, b, d) }.is_ok();
                let end = stream.record_event(timing).map_err(driver_error("event"))?;
                events.push((index, ran, start, end));
            }
        }
        let mut times = vec![f32::INFINITY; candidates.len()];
        for (index, ran, start, end) in events {
            let ms = start.elapsed_ms(&end).map_err(driver_error("event time"))?;
            if ran {
                times[index] = times[index].min(ms);
            }
        }
        let mut best = (f32::INFINITY, first, 0usize);
        for (index, (&ms, algo)) in times.iter().zip(&candidates).enumerate() {
            if ms < best.0 {
                best = (ms, *algo, index);
            }
        }
        if log {
            eprintln!("lowp-autotune {:?} -> candidate {} ms {:?}", g.plan_key(), best.2, times);
        }
        gemm_tuning::record_tuned(key, best.1.data);
        Ok(best.1)
    }

    /// Whether cuBLASLt can run `algo` for this GEMM within our workspace (an algorithm from a
    /// tuning file is checked before use).
    pub(super) unsafe fn accepts(
        &self,
        desc: lts::cublasLtMatmulDesc_t,
        a: lts::cublasLtMatrixLayout_t,
        b: lts::cublasLtMatrixLayout_t,
        d: lts::cublasLtMatrixLayout_t,
        algo: &lts::cublasLtMatmulAlgo_t,
    ) -> bool {
        let mut result: lts::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
        let status =
            unsafe { lts::cublasLtMatmulAlgoCheck(self.handle, desc, a, b, d, d, algo, &mut result) };
        status == lts::cublasStatus_t::CUBLAS_STATUS_SUCCESS
            && result.state == lts::cublasStatus_t::CUBLAS_STATUS_SUCCESS
            && result.workspaceSize <= self.workspace_size
    }
}
