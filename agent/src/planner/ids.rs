//! Id allocation with a free list, lowest id first, so ids stay dense and plans
//! are deterministic. Id 0 is never handed out: it means "none" in the maps.
use std::collections::BTreeSet;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdAllocator {
    /// Every id below `next` that is not in `free` is in use.
    next: u32,
    free: BTreeSet<u32>,
}

impl IdAllocator {
    pub fn alloc(&mut self) -> u32 {
        if let Some(id) = self.free.pop_first() {
            return id;
        }
        self.next = self.next.max(1);
        let id = self.next;
        self.next += 1;
        id
    }

    /// Marks an id found in the maps as used.
    pub fn reserve(&mut self, id: u32) {
        if id == 0 {
            return;
        }
        if id >= self.next {
            self.free.extend(self.next.max(1)..id);
            self.next = id + 1;
        } else {
            self.free.remove(&id);
        }
    }

    pub fn release(&mut self, id: u32) {
        if id != 0 && id < self.next {
            self.free.insert(id);
        }
    }

    /// Ids in use.
    pub fn in_use(&self) -> usize {
        (self.next.max(1) - 1) as usize - self.free.len()
    }
}

/// The two id spaces the planner allocates from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ids {
    pub backends: IdAllocator,
    pub revnat: IdAllocator,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_lowest_free_id_and_never_zero() {
        let mut a = IdAllocator::default();
        assert_eq!((a.alloc(), a.alloc(), a.alloc()), (1, 2, 3));
        a.release(2);
        a.release(1);
        assert_eq!(a.alloc(), 1);
        assert_eq!(a.in_use(), 2);
    }

    #[test]
    fn reserve_leaves_gaps_free() {
        let mut a = IdAllocator::default();
        a.reserve(4);
        a.reserve(2);
        assert_eq!(a.in_use(), 2);
        assert_eq!((a.alloc(), a.alloc(), a.alloc()), (1, 3, 5));
    }
}
