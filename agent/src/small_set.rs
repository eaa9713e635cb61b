//! A sorted set for the indexes that hold one entry per Service or object
//! and almost always one element each (the Services that claim a frontend,
//! the files that define an object, a Service's slices). A `BTreeSet`
//! allocates a node with room for eleven on its first insert, which at 100k
//! Services cost hundreds of megabytes, and a `Vec` still allocates for the
//! one element; this holds one element inline (`SmallVec`'s union layout: no
//! larger than a `Vec` for elements up to 16 bytes) and more in sorted order
//! on the heap, with binary search.
use std::borrow::Borrow;

use smallvec::SmallVec;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SmallSet<T>(SmallVec<[T; 1]>);

impl<T> Default for SmallSet<T> {
    fn default() -> Self {
        Self(SmallVec::new())
    }
}

impl<T: Ord> SmallSet<T> {
    pub const fn new() -> Self {
        Self(SmallVec::new_const())
    }

    /// `false` if it was there already.
    pub fn insert(&mut self, v: T) -> bool {
        match self.0.binary_search(&v) {
            Ok(_) => false,
            Err(i) => {
                // Exact growth while small: one element is the common case.
                if self.0.len() < 4 {
                    self.0.reserve_exact(1);
                }
                self.0.insert(i, v);
                true
            }
        }
    }

    pub fn remove<Q: Ord + ?Sized>(&mut self, v: &Q) -> bool
    where
        T: Borrow<Q>,
    {
        match self.0.binary_search_by(|e| e.borrow().cmp(v)) {
            Ok(i) => {
                self.0.remove(i);
                if self.0.len() <= 1 {
                    // Back inline: a set that shrank keeps no heap block.
                    self.0.shrink_to_fit();
                }
                true
            }
            Err(_) => false,
        }
    }

    pub fn contains<Q: Ord + ?Sized>(&self, v: &Q) -> bool
    where
        T: Borrow<Q>,
    {
        self.0.binary_search_by(|e| e.borrow().cmp(v)).is_ok()
    }

    pub fn first(&self) -> Option<&T> {
        self.0.first()
    }
}

impl<T> SmallSet<T> {
    /// In ascending order.
    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'a, T> IntoIterator for &'a SmallSet<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<T: Ord> FromIterator<T> for SmallSet<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut v: SmallVec<[T; 1]> = iter.into_iter().collect();
        v.sort();
        v.dedup();
        v.shrink_to_fit();
        Self(v)
    }
}

impl<T: Ord> Extend<T> for SmallSet<T> {
    fn extend<I: IntoIterator<Item = T>>(&mut self, iter: I) {
        for v in iter {
            self.insert(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn behaves_as_a_btreeset() {
        let mut s = SmallSet::new();
        let mut b = BTreeSet::new();
        // A fixed pseudo-random sequence of inserts and removes.
        let mut x: u32 = 7;
        for _ in 0..2000 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            let v = (x >> 16) % 50;
            if x & 1 == 0 {
                assert_eq!(s.insert(v), b.insert(v));
            } else {
                assert_eq!(s.remove(&v), b.remove(&v));
            }
            assert_eq!(s.len(), b.len());
            assert!(s.iter().eq(b.iter()));
            assert_eq!(s.contains(&v), b.contains(&v));
            assert_eq!(s.first(), b.first());
        }
        let c: SmallSet<u32> = [3, 1, 3, 2].into_iter().collect();
        assert_eq!(c.iter().copied().collect::<Vec<_>>(), [1, 2, 3]);
    }

    #[test]
    fn one_element_takes_no_heap_block() {
        // What the indexes hold: ids (8 bytes) and paths (16) in a Vec's room.
        assert_eq!(size_of::<SmallSet<u64>>(), size_of::<Vec<u64>>());
        assert_eq!(
            size_of::<SmallSet<std::sync::Arc<str>>>(),
            size_of::<Vec<u64>>()
        );
        let mut s = SmallSet::new();
        s.insert(1u64);
        assert!(!s.0.spilled());
        s.insert(2);
        assert!(s.0.spilled());
        s.remove(&2);
        assert!(!s.0.spilled(), "a set back to one element is inline again");
    }
}
