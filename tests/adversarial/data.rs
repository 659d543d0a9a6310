use crate::common::TestFn;

pub const TESTS: &[(&str, TestFn)] = &[];
