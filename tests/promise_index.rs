//! The promise-to-test index of `src/guide/promises.md`, kept true: under
//! each promise, an *Attacked by:* and a *Checked by:* paragraph name tests
//! as `` `BINARY NAME` `` (the test target, then the name libtest prints),
//! and this test fails when one of them is no test any more.
//!
//! How a name is found: in the source, not by running the binaries. The
//! `harness = false` binaries name each test by its function's path within
//! the binary (`tests!` in `tests/common/registry.rs` builds the name from
//! `module_path!()` and the function), so `extremes::counts_at_u32_max_are_refused`
//! of `adversarial` exists exactly when `tests/adversarial/extremes.rs` (the
//! module `extremes` of the binary's root file) defines
//! `fn counts_at_u32_max_are_refused` and a `tests![...]` there registers
//! it. Asking each binary for `--list` instead would need every other test
//! executable built and found from inside this one (cargo names no test
//! executable to another test) and run (with features some builds lack,
//! and the device binaries' start-up checks); the source is there on every
//! host. `lib NAME` is a unit test of the library (`#[test]`, `src/`),
//! `compile_fail NAME` the case `tests/compile_fail/NAME.rs`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The crate's root.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Each test target's root file: the `[[test]]` entries of `Cargo.toml`,
/// the other files directly in `tests/`, and `lib` (`src/lib.rs`).
fn targets() -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    out.insert("lib".to_owned(), root().join("src/lib.rs"));
    for entry in fs::read_dir(root().join("tests")).expect("tests/") {
        let path = entry.expect("tests/ entry").path();
        if path.extension().is_some_and(|e| e == "rs") {
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            out.insert(stem, path);
        }
    }
    let manifest = fs::read_to_string(root().join("Cargo.toml")).expect("Cargo.toml");
    for block in manifest.split("[[test]]").skip(1) {
        let value = |key: &str| {
            block.lines().find_map(|l| {
                let (k, v) = l.split_once('=')?;
                (k.trim() == key).then(|| v.trim().trim_matches('"').to_owned())
            })
        };
        if let (Some(name), Some(path)) = (value("name"), value("path")) {
            out.insert(name, root().join(path));
        }
    }
    out
}

/// The file that holds module `seg` of the module in `file` (whose child
/// modules live in `dir`): a `#[path]` file, `dir/seg.rs`, `dir/seg/mod.rs`,
/// or `file` itself for an inline `mod seg { ... }`. With the next `dir`.
fn child(file: &Path, dir: &Path, seg: &str) -> Option<(PathBuf, PathBuf)> {
    let text = fs::read_to_string(file).ok()?;
    let decl = format!("mod {seg};");
    let lines: Vec<&str> = text.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        if l.trim_start().trim_start_matches("pub ").starts_with(&decl) {
            for a in lines[..i]
                .iter()
                .rev()
                .take_while(|a| a.trim_start().starts_with("#["))
            {
                if let Some(p) = a.trim().strip_prefix("#[path = \"") {
                    let p = file.parent()?.join(p.trim_end_matches("\"]"));
                    let next = p.with_extension("");
                    return Some((p, next));
                }
            }
        }
    }
    let flat = dir.join(format!("{seg}.rs"));
    if flat.exists() {
        return Some((flat, dir.join(seg)));
    }
    let nested = dir.join(seg).join("mod.rs");
    if nested.exists() {
        return Some((nested, dir.join(seg)));
    }
    text.contains(&format!("mod {seg} {{"))
        .then(|| (file.to_owned(), dir.join(seg)))
}

/// Every `.rs` file of the target whose root is `root_file`.
fn target_files(root_file: &Path) -> Vec<PathBuf> {
    let mut out = vec![root_file.to_owned()];
    let dirs = [
        root_file.parent().unwrap().to_owned(),
        root_file.with_extension(""),
    ];
    let flat = root_file
        .file_name()
        .is_some_and(|n| n != "main.rs" && n != "lib.rs");
    for dir in dirs.iter().skip(usize::from(flat)) {
        if let Ok(entries) = fs::read_dir(dir) {
            out.extend(
                entries
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|e| e == "rs")),
            );
        }
    }
    out
}

/// Whether `name` is a test of the target rooted at `root_file`, or why not.
fn find(root_file: &Path, name: &str) -> Result<(), String> {
    let segs: Vec<&str> = name.split("::").collect();
    let (func, mods) = segs.split_last().ok_or("an empty name")?;
    let (mut file, mut dir) = (root_file.to_owned(), root_file.parent().unwrap().to_owned());
    if root_file
        .file_name()
        .is_some_and(|n| n != "main.rs" && n != "lib.rs" && n != "mod.rs")
    {
        dir = root_file.with_extension("");
        // A single-file target's child modules sit beside it or below it.
        if !dir.exists() {
            dir = root_file.parent().unwrap().to_owned();
        }
    }
    for seg in mods {
        (file, dir) = child(&file, &dir, seg)
            .ok_or_else(|| format!("no module `{seg}` under {}", file.display()))?;
    }
    let text = fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| {
            let l = l
                .trim_start()
                .trim_start_matches("pub ")
                .trim_start_matches("async ");
            l.strip_prefix("fn ")
                .and_then(|r| r.strip_prefix(func))
                .is_some_and(|r| r.starts_with('(') || r.starts_with('<'))
        })
        .ok_or_else(|| format!("{} defines no `fn {func}`", file.display()))?;
    let is_unit_test = lines[at.saturating_sub(8)..at]
        .iter()
        .any(|l| l.trim() == "#[test]");
    if is_unit_test {
        return Ok(());
    }
    // A libtest-mimic binary: the function must be in a `tests![...]` table.
    let registered = target_files(root_file).iter().any(|f| {
        let text = fs::read_to_string(f).unwrap_or_default();
        text.split("tests![").skip(1).any(|rest| {
            table_of(rest)
                .split(|c: char| c == ',' || c.is_whitespace())
                .any(|entry| entry.rsplit("::").next() == Some(*func))
        })
    });
    if registered {
        Ok(())
    } else {
        Err(format!(
            "`fn {func}` of {} is in no tests![...] table",
            file.display()
        ))
    }
}

/// What `rest`, the text after a `tests![`, holds up to its closing `]`
/// (entries may carry attributes, `#[cfg(...)]`).
fn table_of(rest: &str) -> &str {
    let mut depth = 1;
    for (i, c) in rest.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            _ => {}
        }
        if depth == 0 {
            return &rest[..i];
        }
    }
    rest
}

/// A test as the index names it: its binary and its name.
type Named = (String, String);

/// One promise of the index: its title, and the tests of its *Attacked by*
/// and *Checked by* paragraphs.
struct Promise {
    title: String,
    attacked: Vec<Named>,
    checked: Vec<Named>,
}

/// The index: each promise of the guide.
fn index(text: &str) -> Vec<Promise> {
    let mut out = Vec::new();
    for bullet in text.split("\n- **").skip(1) {
        let title = bullet.split("**").next().unwrap_or("").to_owned();
        let part = |label: &str| -> Vec<Named> {
            let Some((_, rest)) = bullet.split_once(label) else {
                return Vec::new();
            };
            let para = rest.split("\n\n").next().unwrap_or("");
            let para = para.split("*Checked by:*").next().unwrap_or("");
            para.split('`')
                .skip(1)
                .step_by(2)
                .filter_map(|span| span.split_once(' '))
                .map(|(b, n)| (b.to_owned(), n.to_owned()))
                .collect()
        };
        assert!(
            bullet.contains("*Attacked by:*") && bullet.contains("*Checked by:*"),
            "the promise {title:?} has no *Attacked by:* or no *Checked by:* paragraph"
        );
        out.push(Promise {
            attacked: part("*Attacked by:*"),
            checked: part("*Checked by:*"),
            title,
        });
    }
    out
}

#[test]
fn every_test_the_promises_name_exists() {
    let text = fs::read_to_string(root().join("src/guide/promises.md")).expect("promises.md");
    let targets = targets();
    let promises = index(&text);
    assert!(
        promises.len() >= 10,
        "only {} promises found",
        promises.len()
    );
    let mut missing = Vec::new();
    for Promise {
        title,
        attacked,
        checked,
    } in &promises
    {
        assert!(
            !checked.is_empty(),
            "the promise {title:?} names no test that checks it"
        );
        for (binary, name) in attacked.iter().chain(checked) {
            let found = if binary == "compile_fail" {
                let case = root().join("tests/compile_fail").join(format!("{name}.rs"));
                if case.exists() {
                    Ok(())
                } else {
                    Err(format!("no {}", case.display()))
                }
            } else if let Some(file) = targets.get(binary) {
                find(file, name)
            } else {
                Err(format!("no test target `{binary}`"))
            };
            if let Err(why) = found {
                missing.push(format!("{title}: `{binary} {name}`: {why}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "src/guide/promises.md names tests that do not exist:\n{}",
        missing.join("\n")
    );
}
