//! Tests of CubeCL's sliced memory pool as `vendor/cubecl-runtime` patches it (`vendor/README.md`):
//! a reservation merges only the free run it takes instead of coalescing the whole page first.
//! The patch must place every reservation where the published pool placed it (coalesce the
//! page, then first fit) and never hand out overlapping memory. A reference model of that rule
//! (free gaps between live allocations, first gap that fits, pages in order) is checked against
//! the pool over a long random sequence of reservations and drops.

use cubecl::ir::MemoryDeviceProperties;
use cubecl_runtime::logging::ServerLogger;
use cubecl_runtime::memory_management::{
    ManagedMemoryHandle, MemoryAllocationMode, MemoryConfiguration, MemoryManagement,
    MemoryManagementOptions, MemoryPoolOptions, PoolType,
};
use cubecl_runtime::server::IoError;
use cubecl_runtime::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};
use std::sync::Arc;

const ALIGNMENT: u64 = 32;
const PAGE: u64 = 1 << 20;

/// Storage that hands out ids only: the pool's bookkeeping is what is under test.
#[derive(Default)]
struct IdStorage {
    pages: Vec<StorageId>,
}

impl ComputeStorage for IdStorage {
    type Resource = StorageHandle;

    fn alignment(&self) -> usize {
        ALIGNMENT as usize
    }

    fn get(&mut self, handle: &StorageHandle) -> StorageHandle {
        handle.clone()
    }

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        let id = StorageId::new();
        self.pages.push(id);
        Ok(StorageHandle {
            id,
            utilization: StorageUtilization { offset: 0, size },
        })
    }

    fn dealloc(&mut self, _id: StorageId) {}

    fn flush(&mut self) {}
}

fn sliced_pool() -> MemoryManagement<IdStorage> {
    MemoryManagement::from_configuration(
        IdStorage::default(),
        &MemoryDeviceProperties {
            max_page_size: PAGE,
            alignment: ALIGNMENT,
        },
        MemoryConfiguration::Custom {
            pool_options: vec![MemoryPoolOptions {
                pool_type: PoolType::SlicedPages {
                    page_size: PAGE,
                    max_slice_size: PAGE,
                },
                dealloc_period: None,
            }],
        },
        Arc::new(ServerLogger::default()),
        MemoryManagementOptions::new("sliced pool test").mode(MemoryAllocationMode::Auto),
    )
}

/// The published rule: per page (in the order pages were made), the free gaps between live
/// allocations in address order; the first gap that fits, else a new page.
fn model_place(pages: &[Vec<(u64, u64)>], size: u64) -> (usize, u64) {
    for (page, live) in pages.iter().enumerate() {
        let mut sorted = live.clone();
        sorted.sort();
        let mut cursor = 0;
        for &(offset, len) in sorted.iter().chain(std::iter::once(&(PAGE, 0))) {
            if offset - cursor >= size {
                return (page, cursor);
            }
            cursor = offset + len;
        }
    }
    (pages.len(), 0)
}

/// A deterministic generator (64-bit LCG, high bits).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

#[test]
fn reservations_land_where_coalescing_then_first_fit_puts_them() {
    let mut pool = sliced_pool();
    let mut rng = Lcg(7);
    let mut pages: Vec<Vec<(u64, u64)>> = Vec::new();
    // Live allocations: handle, page, offset, size.
    let mut live: Vec<(ManagedMemoryHandle, usize, u64, u64)> = Vec::new();
    let mut page_of_id: Vec<StorageId> = Vec::new();
    for step in 0..6000 {
        // Grow to about 120 live allocations, then hover there; sizes from 32 B to 96 KiB,
        // multiples of the alignment (no padding: the published rule has a quirk for padded
        // lone slices that this model leaves out).
        let drop_one = !live.is_empty() && (live.len() > 120 || rng.below(3) == 0);
        if drop_one {
            let (_, page, offset, size) = live.swap_remove(rng.below(live.len() as u64) as usize);
            pages[page].retain(|&a| a != (offset, size));
            continue;
        }
        let size = ALIGNMENT * (1 + rng.below(3072));
        let (page, offset) = model_place(&pages, size);
        let handle = pool.reserve(size).unwrap();
        let storage = pool.get_storage(handle.clone().binding()).unwrap();
        let got_page = match page_of_id.iter().position(|&id| id == storage.id) {
            Some(p) => p,
            None => {
                page_of_id.push(storage.id);
                pages.push(Vec::new());
                page_of_id.len() - 1
            }
        };
        assert_eq!(
            (got_page, storage.utilization.offset, storage.utilization.size),
            (page, offset, size),
            "step {step}: a reservation of {size} bytes (page, offset, size), against the model"
        );
        pages[page].push((offset, size));
        live.push((handle, page, offset, size));
    }
    // No two live allocations overlap (implied by the model, checked on the pool's own answers).
    for (i, (a, _, _, _)) in live.iter().enumerate() {
        let sa = pool.get_storage(a.clone().binding()).unwrap();
        for (b, _, _, _) in &live[i + 1..] {
            let sb = pool.get_storage(b.clone().binding()).unwrap();
            let disjoint = sa.id != sb.id
                || sa.utilization.offset + sa.utilization.size <= sb.utilization.offset
                || sb.utilization.offset + sb.utilization.size <= sa.utilization.offset;
            assert!(disjoint, "overlap: {sa:?} and {sb:?}");
        }
    }
    assert!(pages.len() >= 2, "the sequence should have needed more than one page");
    // With everything dropped, a whole page fits in the first page: its free slices merge.
    live.clear();
    let whole = pool.reserve(PAGE).unwrap();
    let storage = pool.get_storage(whole.binding()).unwrap();
    assert_eq!((storage.id, storage.utilization.offset), (page_of_id[0], 0));
}
