//! Property tests with shrinking for the pingpong examples' option parsing
//! (`examples/common/pingpong.rs`, shared by rc/uc/ud/srq_pingpong and
//! perf): numbers against the C library's own `strtol`, and `getopt_long`
//! against every form of every option. Host-only: no device.

#[path = "../examples/common/pingpong.rs"]
#[allow(clippy::items_after_test_module)]
mod pingpong;

/// `parse_c_int` agrees with the C library's `strtol(s, &end, 0)` on
/// every ASCII string: a number exactly when strtol reads all of it
/// (after leading blanks, at least one character) without `ERANGE`,
/// and then the same number.
mod properties {
    use super::pingpong::{getopt_long, opt, parse_c_int, OptDef};
    use proptest::prelude::*;

    fn strtol(s: &str) -> Option<i64> {
        let c = std::ffi::CString::new(s).ok()?;
        let mut end: *mut std::ffi::c_char = std::ptr::null_mut();
        // SAFETY: `c` is a NUL-terminated string that outlives the
        // call; `end` is a valid out-pointer. errno is this thread's.
        let (v, errno, used) = unsafe {
            *libc::__errno_location() = 0;
            let v = libc::strtol(c.as_ptr(), &mut end, 0);
            let used = end.offset_from(c.as_ptr()) as usize;
            (v, *libc::__errno_location(), used)
        };
        let blanks = s.len()
            - s.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r'])
                .len();
        (used == s.len() && used > blanks && errno == 0).then_some(v)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]
        /// Strings made of what numbers are made of, in any order.
        #[test]
        fn parse_c_int_is_strtol_read_whole(s in "[ \t+\\-0-9a-fxX]{0,24}") {
            prop_assert_eq!(parse_c_int(&s), strtol(&s), "{:?}", s);
        }

        /// Any ASCII text.
        #[test]
        fn parse_c_int_is_strtol_on_any_ascii(s in "[\x01-\x7f]{0,12}") {
            prop_assert_eq!(parse_c_int(&s), strtol(&s), "{:?}", s);
        }

        /// Numbers written every way C reads them come back.
        #[test]
        fn numbers_round_trip(v in any::<i64>(), form in 0..3u8, pad in "[ \t]{0,2}") {
            let mag = v.unsigned_abs();
            let body = match form {
                0 => format!("{mag}"),
                1 => format!("0x{mag:x}"),
                _ => format!("0{mag:o}"),
            };
            let s = format!("{pad}{}{body}", if v < 0 { "-" } else { "" });
            prop_assert_eq!(parse_c_int(&s), Some(v), "{:?}", s);
        }
    }

    const DEFS: &[OptDef] = &[
        opt('p', "port", true),
        opt('e', "events", false),
        opt('g', "gid-idx", true),
        opt('c', "chk", false),
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(5_000))]
        /// Options given in any of getopt_long's forms (`-pV`, `-p V`,
        /// `--port=V`, `--port V`, `--po V`, bundled flags), mixed with
        /// positional arguments, parse back to the same options in order
        /// and the same positionals.
        #[test]
        fn getopt_long_reads_every_form(
            items in proptest::collection::vec(
                (0..DEFS.len(), "[a-z0-9]{1,4}", 0..4u8, proptest::bool::ANY), 0..8),
            host in proptest::option::of("[a-z][a-z0-9.]{0,8}"),
        ) {
            let mut argv = Vec::new();
            let mut want = Vec::new();
            for (i, value, form, long) in &items {
                let d = &DEFS[*i];
                let value = d.has_arg.then(|| value.clone());
                want.push((d.short, value.clone()));
                match (&value, long, form) {
                    (None, false, _) => argv.push(format!("-{}", d.short)),
                    (None, true, _) => argv.push(format!("--{}", d.long)),
                    (Some(v), false, 0 | 1) => argv.push(format!("-{}{v}", d.short)),
                    (Some(v), false, _) => {
                        argv.push(format!("-{}", d.short));
                        argv.push(v.clone());
                    }
                    (Some(v), true, 0) => argv.push(format!("--{}={v}", d.long)),
                    (Some(v), true, 1) => {
                        // An unambiguous prefix of the long name.
                        argv.push(format!("--{}", &d.long[..2]));
                        argv.push(v.clone());
                    }
                    (Some(v), true, _) => {
                        argv.push(format!("--{}", d.long));
                        argv.push(v.clone());
                    }
                }
            }
            let positional: Vec<String> = host.into_iter().collect();
            argv.extend(positional.iter().cloned());
            let (got, pos) = getopt_long("x", &argv, DEFS).map_err(TestCaseError::fail)?;
            prop_assert_eq!(got, want, "{:?}", argv);
            prop_assert_eq!(pos, positional, "{:?}", argv);
        }
    }
}
