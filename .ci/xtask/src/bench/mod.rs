//! `xtask bench ...`: everything the bench does with what its programs
//! printed. The guest scripts (`.ci/bench/guest`, `qp-setup.sh`,
//! `cmtime-guest`, `ex-guest`) only start programs, each run's output in a
//! file of its own in the output folder (a run that failed is renamed
//! `*.failed`); each part of the bench then calls one subcommand here,
//! which reads those files, computes the medians, ranges, ratios and
//! per-operation counts, and prints the part's table.
//!
//! ## Changing a table
//!
//! Each table's columns are defined once, in [`tables`]
//! (`.ci/xtask/src/bench/tables.rs`): the first table of `.ci/vm bench` is
//! the constant `PERFTEST`, the data-path count `DATAPATH`, and so on (each
//! constant's comment names the function that fills its rows). To widen,
//! rename or realign a column, edit its `l(..)`/`r(..)` entry there: the
//! header and every row follow. To add or drop a column, edit the entry
//! and the cells of the row where the function named in the comment
//! builds it.
//! What runs in a table with a row per run (workloads, sizes) is in
//! [`plan`] (`plan.rs`), which the scripts read through `xtask bench list`.
//! Then `cd .ci/xtask && cargo test` (the tables' tests pin the guide's
//! quoted lines) and update `src/guide/performance.md` if its quoted output
//! changes.
//!
//! | subcommand | script | module |
//! |---|---|---|
//! | `list NAME` | guest, ex-guest | [`plan`] |
//! | `perftest OUT REPS NAME...`, `async`, `pingpong`, `halves`, `register FILE` | guest | [`timed`] |
//! | `datapath OUT`, `whole OUT SHORT LONG`, `inplace OUT N` | guest | [`counted`] |
//! | `scale OUT REPS LO HI`, `qp-setup WORK ROUNDS` | guest, qp-setup.sh | [`qps`] |
//! | `cmtime-check LOG`, `cmtime OUT CONNS ROUND...` | cmtime-guest | [`cmtime`] |
//! | `ex-check LOG PATH`, `ex-latency OUT REPS`, `ex-datapath OUT` | ex-guest | [`ex`] |
//! | `list hosts`, `hosts OUT REPS NAME...` | `.ci/hosts-bench` | [`plan`], [`timed`] |
//!
//! A subcommand that prints a table exits with the number of its failures
//! (runs that gave no result), which the scripts add to theirs.

mod cmtime;
mod counted;
mod ex;
mod parse;
mod plan;
mod qps;
mod stats;
mod tables;
mod timed;

use std::path::PathBuf;
use std::process::ExitCode;

/// Runs `xtask bench ARGS...`.
pub fn main(args: &[String]) -> Result<ExitCode, String> {
    let Some((cmd, rest)) = args.split_first() else {
        return Err("usage: xtask bench SUBCOMMAND ... (see .ci/xtask/src/bench/mod.rs)".into());
    };
    let failures = match cmd.as_str() {
        "list" => return plan::list(rest),
        "perftest" => timed::perftest(rest)?,
        "hosts" => timed::hosts(rest)?,
        "async" => timed::async_wait(rest)?,
        "pingpong" => timed::pingpong(rest)?,
        "halves" => timed::halves(rest)?,
        "register" => timed::register(rest)?,
        "datapath" => counted::datapath(rest)?,
        "whole" => counted::whole_table(rest)?,
        "inplace" => counted::inplace(rest)?,
        "scale" => qps::scale(rest)?,
        "qp-setup" => qps::qp_setup(rest)?,
        "cmtime-check" => cmtime::check(rest)?,
        "cmtime" => cmtime::tables(rest)?,
        "ex-check" => ex::check(rest)?,
        "ex-latency" => ex::latency(rest)?,
        "ex-datapath" => ex::datapath(rest)?,
        other => return Err(format!("unknown bench subcommand {other:?}")),
    };
    Ok(ExitCode::from(failures.min(255) as u8))
}

/// An output folder: the files the runs of one part wrote.
pub struct Out(PathBuf);

impl Out {
    pub fn new(dir: &str) -> Self {
        Out(PathBuf::from(dir))
    }

    /// The path of `name` in the folder.
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// The text of `name`, empty if there is none (a run that failed).
    pub fn text(&self, name: &str) -> String {
        std::fs::read(self.path(name))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The inclusive counts of callgrind's profile `name.cg`: from
    /// `name.ann` if the script kept callgrind_annotate's output (and
    /// deleted the large profile), else from callgrind_annotate run here.
    pub fn annotated(&self, name: &str) -> Vec<parse::Incl> {
        let ann = self.text(&format!("{name}.ann"));
        if !ann.is_empty() {
            return parse::inclusive(&ann);
        }
        let out = std::process::Command::new("callgrind_annotate")
            .args(["--inclusive=yes", "--threshold=100"])
            .arg(self.path(&format!("{name}.cg")))
            .stderr(std::process::Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => parse::inclusive(&String::from_utf8_lossy(&o.stdout)),
            _ => Vec::new(),
        }
    }
}

/// The output folder named by a subcommand's first argument, and its
/// arguments after it parsed as the numbers `names` name (`usage` says
/// what is missing).
pub fn folder_and<const N: usize>(
    args: &[String],
    usage: &str,
    names: [&str; N],
) -> Result<(Out, [u64; N]), String> {
    let out = Out::new(args.first().ok_or(format!("usage: xtask bench {usage}"))?);
    let mut v = [0; N];
    for (i, name) in names.iter().enumerate() {
        v[i] = arg(args, i + 1, name)?;
    }
    Ok((out, v))
}

/// Parses argument `i` of a subcommand as a number.
pub fn arg<T: std::str::FromStr>(args: &[String], i: usize, what: &str) -> Result<T, String> {
    let v = args.get(i).ok_or_else(|| format!("missing {what}"))?;
    v.parse()
        .map_err(|_| format!("{what}: not a number: {v:?}"))
}

/// For the tests: a folder of the files a part's runs leave, `files`
/// written in it.
#[cfg(test)]
pub fn folder(name: &str, files: &[(&str, &str)]) -> (PathBuf, Out) {
    let dir = std::env::temp_dir().join(format!("xtask-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (f, text) in files {
        std::fs::write(dir.join(f), text).unwrap();
    }
    let out = Out::new(dir.to_str().unwrap());
    (dir, out)
}
