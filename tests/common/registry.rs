//! The tables of tests the `harness = false` binaries hand libtest-mimic.
//!
//! A test's name, the one libtest prints and filters on, is the path of
//! its function within the binary: `extremes::sge_len_past_the_chunk_or_u32_is_refused`
//! in the `adversarial` binary is the function
//! `sge_len_past_the_chunk_or_u32_is_refused` of `tests/adversarial/extremes.rs`,
//! as `cargo test` would print a `#[test]` function. [`tests!`] builds each
//! entry from the function's path itself (`module_path!()` and
//! `stringify!`), so the name cannot drift from the function: searching for
//! a failing test's name finds its `fn`.
//!
//! This file has no dependency of its own: `tests/hosts.rs`, which does not
//! include the rest of `common`, includes it too.

/// One registered test: its function and the path that names it. Made
/// only by [`tests!`].
#[derive(Clone, Copy)]
pub struct Test<F = super::TestFn> {
    /// `module_path!()` of the registering module, `::`, the function's
    /// path from there: the binary's crate name first.
    path: &'static str,
    /// What the test runs.
    pub f: F,
}

impl<F> Test<F> {
    /// For [`tests!`] only: `path` must be the function's full path.
    #[doc(hidden)]
    pub const fn new(path: &'static str, f: F) -> Self {
        Test { path, f }
    }

    /// The name libtest prints: the function's path without the binary's
    /// crate name (`extremes::counts_at_u32_max_are_refused`; a function of
    /// the binary's root module is its bare name).
    pub fn name(&self) -> &'static str {
        self.path
            .split_once("::")
            .map_or(self.path, |(_, rest)| rest)
    }
}

/// A table of [`Test`]s, each named by its function's path: `tests![f,
/// sub::g, #[cfg(feature = "cm")] h]` (a function of a child module by its
/// path from the registering module); `tests![f::<0, 1, 2>]` registers
/// `f::<0>`, `f::<1>` and `f::<2>` of a function generic over a `const`
/// number, each named so.
#[macro_export]
macro_rules! tests {
    ($f:ident ::< $($n:literal),+ $(,)? >) => {
        &[$($crate::common::registry::Test::new(
            concat!(module_path!(), "::", stringify!($f), "::<", $n, ">"),
            $f::<$n>,
        )),+]
    };
    ($($(#[$attr:meta])* $($seg:ident)::+),* $(,)?) => {
        &[$(
            $(#[$attr])*
            $crate::common::registry::Test::new(
                concat!(module_path!() $(, "::", stringify!($seg))+),
                $($seg)::+,
            )
        ),*]
    };
}
