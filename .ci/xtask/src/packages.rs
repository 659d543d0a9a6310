//! `xtask packages ...`: Debian's package indexes, for `.ci/rdma-core-prefix`
//! (which downloads them, checks their hashes with `sha256sum` and their
//! signature with `gpgv`, and unpacks the `.deb`s it is told to).
//!
//! | command | input | prints |
//! |---|---|---|
//! | `index-sha256 INRELEASE PATH` | a `Release`/`InRelease` file | the SHA256 its `SHA256:` field gives PATH (`main/binary-amd64/Packages.xz`) |
//! | `rdma-core PACKAGES...` | a `Packages` index on standard input | `PACKAGE FILENAME SHA256 VERSION`, a line for each of PACKAGES built from rdma-core |
//!
//! `rdma-core` exits 1, saying which it found, unless it found every one of
//! PACKAGES. A package renamed for the 64-bit `time_t` transition
//! (`librdmacm1t64`, trixie on) stands for its old name (`librdmacm1`).

use std::io::Read;
use std::process::ExitCode;

/// Runs `xtask packages ARGS...`.
pub fn main(args: &[String]) -> Result<ExitCode, String> {
    match args {
        [cmd, release, path] if cmd == "index-sha256" => {
            let text = std::fs::read_to_string(release).map_err(|e| format!("{release}: {e}"))?;
            let sha =
                index_sha256(&text, path).ok_or_else(|| format!("{release} lists no {path}"))?;
            println!("{sha}");
            Ok(ExitCode::SUCCESS)
        }
        [cmd, wanted @ ..] if cmd == "rdma-core" && !wanted.is_empty() => {
            let mut index = String::new();
            std::io::stdin()
                .read_to_string(&mut index)
                .map_err(|e| format!("standard input: {e}"))?;
            let found = rdma_core_packages(&index, wanted);
            found
                .iter()
                .for_each(|p| println!("{} {} {} {}", p.package, p.filename, p.sha256, p.version));
            if found.len() == wanted.len() {
                return Ok(ExitCode::SUCCESS);
            }
            let names: Vec<&str> = found.iter().map(|p| p.package.as_str()).collect();
            eprintln!(
                "packages: the index lists {} of: {}",
                names.join(" "),
                wanted.join(" ")
            );
            Ok(ExitCode::FAILURE)
        }
        _ => {
            Err("usage: xtask packages index-sha256 INRELEASE PATH | rdma-core PACKAGES...".into())
        }
    }
}

/// The hash the `SHA256:` field of a Release file gives `path` (its lines
/// ` HASH SIZE PATH`).
fn index_sha256(release: &str, path: &str) -> Option<String> {
    let mut in_field = false;
    for line in release.lines() {
        if line.starts_with(|c: char| c.is_ascii_alphabetic()) {
            in_field = line.starts_with("SHA256:");
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        if in_field && fields.len() >= 3 && fields[2] == path {
            return Some(fields[0].to_owned());
        }
    }
    None
}

/// One binary package of a Packages index.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Package {
    pub package: String,
    pub filename: String,
    pub sha256: String,
    pub version: String,
    /// The source package's name (the `Source` field's first word; Debian
    /// leaves the field out when it is the package's own name).
    pub source: String,
}

/// The paragraphs of a Packages index (blank-line separated, `Field: value`
/// lines; continuation lines, which start with a space, are skipped).
fn paragraphs(index: &str) -> impl Iterator<Item = Package> + '_ {
    index
        .split("\n\n")
        .filter(|p| !p.trim().is_empty())
        .map(|para| {
            let mut p = Package::default();
            for line in para.lines().filter(|l| !l.starts_with([' ', '\t'])) {
                let Some((key, value)) = line.split_once(':') else {
                    continue;
                };
                let value = value.trim().to_owned();
                match key {
                    "Package" => p.package = value,
                    "Filename" => p.filename = value,
                    "SHA256" => p.sha256 = value,
                    "Version" => p.version = value,
                    "Source" => p.source = value.split_whitespace().next().unwrap_or("").to_owned(),
                    _ => {}
                }
            }
            p
        })
}

/// The packages of `wanted` (or their `t64` renames) built from rdma-core,
/// in the index's order.
fn rdma_core_packages(index: &str, wanted: &[String]) -> Vec<Package> {
    paragraphs(index)
        .filter(|p| p.source == "rdma-core")
        .filter(|p| {
            let name = p.package.strip_suffix("t64").unwrap_or(&p.package);
            wanted.iter().any(|w| w == name)
        })
        .collect()
}

#[cfg(test)]
mod unit {
    use super::*;

    /// Bullseye's InRelease, shortened (a line of each section), and three
    /// paragraphs of its main/binary-amd64 Packages (rdma-core 33), with
    /// librdmacm1 renamed librdmacm1t64 as trixie names it.
    const IN_RELEASE: &str = include_str!("../tests/samples/InRelease");
    const PACKAGES: &str = include_str!("../tests/samples/Packages");

    #[test]
    fn the_release_file_gives_the_index_hash() {
        let sha = |path| index_sha256(IN_RELEASE, path);
        let amd64 = "1c3405444297ead864711c18e64bce4810db63b48340a2f9d81182d9f235ad71";
        // The MD5Sum field lists the file too: its hash is not the one.
        assert_eq!(sha("main/binary-amd64/Packages.xz").as_deref(), Some(amd64));
        assert!(sha("main/binary-armhf/Packages.xz").is_some_and(|s| s.starts_with("c79c79d4")));
        assert_eq!(sha("main/binary-amd64/Packages.gz"), None);
    }

    #[test]
    fn the_index_gives_rdma_cores_packages() {
        let wanted = [
            "libibverbs1".to_owned(),
            "librdmacm1".to_owned(),
            "rdma-core".to_owned(),
        ];
        let found = rdma_core_packages(PACKAGES, &wanted);
        let names: Vec<&str> = found.iter().map(|p| p.package.as_str()).collect();
        // rdma-core itself has no Source field: Debian leaves out the package's own name.
        assert_eq!(names, ["libibverbs1", "librdmacm1t64"]);
        assert!(found.iter().all(|p| p.version == "33.2-1"
            && p.sha256.len() == 64
            && p.filename.ends_with(".deb")));
    }
}
