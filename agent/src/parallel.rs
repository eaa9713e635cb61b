//! Work split over two threads, for the few one-shot walks big enough to
//! need it: reading a million-entry map, or encoding what was read.

/// Runs `a` on a second thread while `b` runs on this one. A panic in
/// either comes out of this call.
pub fn both<A: Send, B>(a: impl FnOnce() -> A + Send, b: impl FnOnce() -> B) -> (A, B) {
    std::thread::scope(|s| {
        let a = s.spawn(a);
        let b = b();
        (a.join().unwrap_or_else(|p| std::panic::resume_unwind(p)), b)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_both_and_returns_each_result() {
        let v = [1, 2, 3];
        let (a, b) = super::both(|| v.iter().sum::<i32>(), || v.len());
        assert_eq!((a, b), (6, 3));
    }

    #[test]
    #[should_panic(expected = "from the other thread")]
    fn a_panic_on_the_other_thread_reaches_the_caller() {
        super::both(|| panic!("from the other thread"), || ());
    }
}
