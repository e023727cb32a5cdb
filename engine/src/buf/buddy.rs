//! A binary buddy allocator over offsets: blocks of 4 KiB << order, merged with their buddy on
//! free. It hands out offsets only; the arena turns them into memory.

use std::collections::BTreeSet;

pub(crate) const BLOCK_MIN_BYTES: usize = 4096;
/// The largest block is BLOCK_MIN_BYTES << ORDER_MAX (8 MiB): a 4 MiB chunk plus its header
/// fits in one.
pub(crate) const ORDER_MAX: usize = 11;
pub(crate) const BLOCK_MAX_BYTES: usize = BLOCK_MIN_BYTES << ORDER_MAX;

pub(crate) struct Buddy {
    /// Free block offsets per order.
    free: Vec<BTreeSet<usize>>,
    free_bytes: usize,
}

impl Buddy {
    /// Manage `bytes` (a multiple of BLOCK_MAX_BYTES) starting at offset 0.
    pub(crate) fn new(bytes: usize) -> Buddy {
        assert_eq!(bytes % BLOCK_MAX_BYTES, 0);
        let mut free = vec![BTreeSet::new(); ORDER_MAX + 1];
        for offset in (0..bytes).step_by(BLOCK_MAX_BYTES) {
            free[ORDER_MAX].insert(offset);
        }
        Buddy {
            free,
            free_bytes: bytes,
        }
    }

    pub(crate) fn order_for(bytes: usize) -> Option<usize> {
        let blocks = bytes.max(1).div_ceil(BLOCK_MIN_BYTES);
        let order = blocks.next_power_of_two().trailing_zeros() as usize;
        (order <= ORDER_MAX).then_some(order)
    }

    pub(crate) fn allocate(&mut self, order: usize) -> Option<usize> {
        let found = (order..=ORDER_MAX).find(|&candidate| !self.free[candidate].is_empty())?;
        let offset = self.free[found].pop_first().expect("non-empty free list");
        for split in (order..found).rev() {
            self.free[split].insert(offset + (BLOCK_MIN_BYTES << split));
        }
        self.free_bytes -= BLOCK_MIN_BYTES << order;
        Some(offset)
    }

    pub(crate) fn release(&mut self, mut offset: usize, mut order: usize) {
        self.free_bytes += BLOCK_MIN_BYTES << order;
        while order < ORDER_MAX {
            let buddy = offset ^ (BLOCK_MIN_BYTES << order);
            if !self.free[order].remove(&buddy) {
                break;
            }
            offset = offset.min(buddy);
            order += 1;
        }
        let inserted = self.free[order].insert(offset);
        assert!(
            inserted,
            "block at {offset} of order {order} released twice"
        );
    }

    pub(crate) fn free_bytes(&self) -> usize {
        self.free_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_do_not_overlap_and_merge_back() {
        let total = 2 * BLOCK_MAX_BYTES;
        let mut buddy = Buddy::new(total);
        let mut taken = Vec::new();
        let mut seed = 7u64;
        for _ in 0..200 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let bytes = 1 + (seed >> 33) as usize % (BLOCK_MAX_BYTES / 2);
            let order = Buddy::order_for(bytes).unwrap();
            if let Some(offset) = buddy.allocate(order) {
                let size = BLOCK_MIN_BYTES << order;
                assert_eq!(offset % size, 0, "blocks are aligned to their size");
                for &(other, other_size) in &taken {
                    assert!(offset + size <= other || other + other_size <= offset);
                }
                taken.push((offset, size));
            }
            if taken.len() > 5 {
                let (offset, size) = taken.remove((seed as usize) % taken.len());
                buddy.release(offset, Buddy::order_for(size).unwrap());
            }
        }
        for (offset, size) in taken.drain(..) {
            buddy.release(offset, Buddy::order_for(size).unwrap());
        }
        assert_eq!(buddy.free_bytes(), total);
        assert_eq!(buddy.free[ORDER_MAX].len(), 2, "everything merged back");
    }

    #[test]
    fn order_bounds() {
        assert_eq!(Buddy::order_for(0), Some(0));
        assert_eq!(Buddy::order_for(4096), Some(0));
        assert_eq!(Buddy::order_for(4097), Some(1));
        assert_eq!(Buddy::order_for(BLOCK_MAX_BYTES), Some(ORDER_MAX));
        assert_eq!(Buddy::order_for(BLOCK_MAX_BYTES + 1), None);
    }
}
