//! Zeroed words for atomic accumulators (the amaxes that kernels `fetch_max` into), carved from
//! an arena that one fill launch zeroes, instead of one fill launch per accumulator: an FP8 MoE
//! training step took about 250 one-word fills, and CubeCL's launch path, not the GPU, bounds
//! that step.
//!
//! Each slot is handed out once and never reused, so no later launch can clear a value someone
//! still reads: the arena's memory lives while any of its slots (views of it) does, and a new
//! arena replaces a full one. Slots start at multiples of 256 bytes (wgpu's storage-buffer offset
//! alignment). The arena is per thread and client: the fill runs on the thread's stream, before
//! any launch that uses its slots.

use std::any::TypeId;
use std::cell::RefCell;

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::util::buffers::fill;

/// Bytes of one arena: 256 slots of up to 64 words.
const ARENA_BYTES: u64 = 64 * 1024;
/// Slot granularity (wgpu binds storage buffers at offsets that are multiples of 256 bytes).
const SLOT_BYTES: u64 = 256;

struct Arena {
    /// The runtime and server it belongs to.
    key: (TypeId, usize),
    handle: Handle,
    size: u64,
    next: u64,
}

thread_local! {
    static ARENAS: RefCell<Vec<Arena>> = const { RefCell::new(Vec::new()) };
}

/// `words` (at least one) u32 on the device that read 0 until a launch after this call writes
/// them.
pub fn zeroed_words<R: Runtime>(client: &ComputeClient<R>, words: usize) -> Handle {
    // The view is exactly the words asked for (callers size reads and sub-views by it); the slot
    // it takes is whole 256-byte units.
    let exact = words.max(1) as u64 * 4;
    let bytes = exact.next_multiple_of(SLOT_BYTES);
    // A server's utilities (and their `info`) live as long as the server, shared by its clients.
    let key = (
        TypeId::of::<R>(),
        client.info() as *const _ as *const u8 as usize,
    );
    ARENAS.with(|arenas| {
        let mut arenas = arenas.borrow_mut();
        let index = match arenas.iter().position(|a| a.key == key) {
            Some(i) => i,
            None => {
                arenas.push(new_arena(client, key, bytes));
                arenas.len() - 1
            }
        };
        if arenas[index].size - arenas[index].next < bytes {
            arenas[index] = new_arena(client, key, bytes);
        }
        let arena = &mut arenas[index];
        let start = arena.next;
        arena.next += bytes;
        arena
            .handle
            .clone()
            .offset_start(start)
            .offset_end(arena.size - start - exact)
    })
}

fn new_arena<R: Runtime>(client: &ComputeClient<R>, key: (TypeId, usize), bytes: u64) -> Arena {
    let size = ARENA_BYTES.max(bytes);
    let handle = client.empty(size as usize);
    fill(client, &handle, (size / 4) as usize, 0);
    Arena {
        key,
        handle,
        size,
        next: 0,
    }
}
