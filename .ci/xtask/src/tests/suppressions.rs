//! The rules of `.ci/valgrind.supp`, checked before every valgrind run
//! (`xtask tests check-suppressions FILE`): every suppression is explained
//! (a `#` comment on the last non-blank line above its `{`), and its frames
//! name C library code only: no Rust frame (mangled `_ZN`/`_R` names, `::`)
//! and nothing of `rdma_verbs`, so none of this crate's or the tests' (a
//! crate bug is fixed, not suppressed).

/// Each broken rule, as `FILE:LINE: what` (empty: the file is fine).
pub fn check(file_name: &str, text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut prev = "";
    // The line number within the current `{ ... }` (0: outside one).
    let mut inside = 0;
    for (n, line) in text.lines().enumerate().map(|(i, l)| (i + 1, l)) {
        if line.starts_with('{') {
            if !prev.starts_with('#') {
                problems.push(format!(
                    "{file_name}:{n}: suppression without a comment above it"
                ));
            }
            inside = 1;
        } else if inside > 0 && line.starts_with('}') {
            inside = 0;
        } else if inside > 0 {
            inside += 1;
        }
        // Lines 1 to 3 are the brace, the name and the kind; frames follow.
        if inside > 3 && names_rust(line) {
            problems.push(format!(
                "{file_name}:{n}: a suppression may not name Rust frames: {line}"
            ));
        }
        if !line.trim().is_empty() {
            prev = line;
        }
    }
    problems
}

/// Does a frame line name Rust code or this crate?
fn names_rust(line: &str) -> bool {
    let frame = line.trim_start_matches([' ', '\t']);
    let mangled = ["fun:", "obj:", "src:"]
        .iter()
        .filter_map(|kind| frame.strip_prefix(kind))
        .any(|name| name.starts_with("_ZN") || name.starts_with("_R"));
    mangled
        || ["::", "rdma_verbs", "rdma-verbs"]
            .iter()
            .any(|s| line.contains(s))
}

#[cfg(test)]
mod unit {
    use super::check;

    #[test]
    fn the_projects_file_passes() {
        let text = include_str!("../../../valgrind.supp");
        assert_eq!(check("valgrind.supp", text), Vec::<String>::new());
    }

    #[test]
    fn an_unexplained_or_rust_suppression_is_refused() {
        let text = "{\n   a\n   Memcheck:Cond\n   fun:ibv_x\n}\n\n# ok\n{\n   b\n   Memcheck:Cond\n   fun:_ZN4core3ptr\n   fun:x::y\n}\n";
        assert_eq!(
            check("s.supp", text),
            [
                "s.supp:1: suppression without a comment above it",
                "s.supp:11: a suppression may not name Rust frames:    fun:_ZN4core3ptr",
                "s.supp:12: a suppression may not name Rust frames:    fun:x::y",
            ]
        );
    }
}
