//! Attacks on the wire records programs exchange ([`Endpoint`] and
//! [`RemoteBuf`]): every truncation, every single-byte change of a good
//! record (including bytes that start or split a multi-byte character),
//! signs, and buffers at the end of the address space. Each must be a typed
//! error, never a panic; a record that parses must say exactly what it
//! said (its own wire form again), and `RemoteBuf::at` must never name an
//! address outside the buffer.

use std::panic::catch_unwind;

use libtest_mimic::Failed;
use rdma_verbs::qp::{Endpoint, Psn, QpNum};
use rdma_verbs::{Error, RemoteBuf};

use crate::common::{Env, Test};

pub const TESTS: &[Test] = tests![
    every_mutation_of_an_endpoint_record,
    every_mutation_of_a_remote_buf_record,
    remote_buf_at_extremes,
];

/// Bytes every position is replaced with: hex digits of both cases, the
/// separator, a sign, NUL, space, and bytes of multi-byte characters.
const PROBES: &[&[u8]] = &[
    b"0",
    b"f",
    b"F",
    b"g",
    b":",
    b"+",
    b"-",
    b"\0",
    b" ",
    "é".as_bytes(),
    "€".as_bytes(),
    &[0xc3],
    &[0xff],
    &[0x80],
];

/// Every variant of `good`: truncations, and each position replaced by
/// each probe (a two- or three-byte probe keeps the length by eating the
/// bytes after it, so multi-byte characters land at every offset).
fn variants(good: &[u8]) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = (0..good.len()).map(|n| good[..n].to_vec()).collect();
    for i in 0..good.len() {
        for p in PROBES {
            let mut v = good.to_vec();
            let end = (i + p.len()).min(v.len());
            v.splice(i..end, p.iter().copied());
            out.push(v);
        }
    }
    out
}

fn every_mutation_of_an_endpoint_record(_env: &Env) -> Result<(), Failed> {
    let ep = Endpoint {
        lid: 0x1a,
        qpn: QpNum::new(0xb1)?,
        psn: Psn::new(0x5e_1d2c)?,
        gid: "fe80::24:13ff:fec5:518f".parse()?,
    };
    let good = ep.to_wire();
    let (mut refused, mut accepted) = (0, 0);
    for v in variants(&good[..Endpoint::WIRE_LEN - 1]) {
        let r = catch_unwind(|| Endpoint::from_wire(&v)).map_err(|_| {
            format!(
                "Endpoint::from_wire panicked on {:?}",
                String::from_utf8_lossy(&v)
            )
        })?;
        match r {
            Ok(parsed) => {
                accepted += 1;
                // Only a change of hex digit (or its case) parses: the
                // record then says the same thing in lower case.
                let again = parsed.to_wire();
                ensure!(
                    again[..Endpoint::WIRE_LEN - 1].eq_ignore_ascii_case(&v),
                    "{:?} parsed as {parsed:?}",
                    String::from_utf8_lossy(&v)
                );
            }
            Err(Error::InvalidArgument { .. }) | Err(Error::OutOfRange { .. }) => refused += 1,
            Err(e) => return Err(format!("untyped refusal {e:?}").into()),
        }
    }
    ensure!(
        refused > 500 && accepted > 0,
        "{refused} refused, {accepted} accepted"
    );
    Ok(())
}

fn every_mutation_of_a_remote_buf_record(_env: &Env) -> Result<(), Failed> {
    let good = RemoteBuf {
        addr: 0x0000_7f12_3456_7000,
        rkey: 0x00ab_cdef,
        len: 0x1000,
    }
    .to_wire();
    let (mut refused, mut accepted) = (0, 0);
    let mut all = variants(&good);
    // Bytes after the NUL, and the record twice.
    all.push([&good[..], b"x"].concat());
    all.push([&good[..], &good[..]].concat());
    for v in all {
        let r = catch_unwind(|| RemoteBuf::from_wire(&v)).map_err(|_| {
            format!(
                "RemoteBuf::from_wire panicked on {:?}",
                String::from_utf8_lossy(&v)
            )
        })?;
        match r {
            Ok(parsed) => {
                accepted += 1;
                // Strict: only the exact lower-case text, with or without
                // its NUL, is a record.
                let again = parsed.to_wire();
                ensure!(
                    v == again || v[..] == again[..RemoteBuf::WIRE_LEN - 1],
                    "{:?} parsed as {parsed:?}",
                    String::from_utf8_lossy(&v)
                );
                ensure!(
                    parsed.addr.checked_add(parsed.len).is_some(),
                    "a wrapping buffer accepted: {parsed:?}"
                );
            }
            Err(Error::InvalidArgument { .. }) => refused += 1,
            Err(e) => return Err(format!("untyped refusal {e:?}").into()),
        }
    }
    ensure!(
        refused > 500 && accepted > 0,
        "{refused} refused, {accepted} accepted"
    );
    Ok(())
}

fn remote_buf_at_extremes(_env: &Env) -> Result<(), Failed> {
    let values = [
        0,
        1,
        7,
        8,
        4095,
        4096,
        4097,
        u64::MAX / 2,
        u64::MAX - 1,
        u64::MAX,
    ];
    let bufs = [
        RemoteBuf {
            addr: 0x1000,
            rkey: 1,
            len: 4096,
        },
        RemoteBuf {
            addr: u64::MAX - 4096,
            rkey: 2,
            len: 4096,
        },
        RemoteBuf {
            addr: u64::MAX - 4095,
            rkey: 3,
            len: 4096,
        }, // its end wraps
        RemoteBuf {
            addr: 0,
            rkey: 4,
            len: u64::MAX,
        },
        RemoteBuf {
            addr: 5,
            rkey: 5,
            len: 0,
        },
    ];
    for b in bufs {
        let wraps = b.addr.checked_add(b.len).is_none();
        for &offset in &values {
            for &len in &values {
                let r = catch_unwind(|| b.at(offset, len))
                    .map_err(|_| format!("{b:?}.at({offset}, {len}) panicked"))?;
                let fits = !wraps && offset.checked_add(len).is_some_and(|end| end <= b.len);
                match r {
                    Ok(a) => {
                        ensure!(fits, "{b:?}.at({offset}, {len}) accepted: {a:?}");
                        ensure!(
                            a.rkey == b.rkey
                                && a.addr >= b.addr
                                && a.addr - b.addr == offset
                                && a.addr.checked_add(len).is_some_and(|e| e <= b.addr + b.len),
                            "{b:?}.at({offset}, {len}) = {a:?} outside the buffer"
                        );
                    }
                    Err(e @ Error::InvalidArgument { .. }) => {
                        ensure!(!fits, "{b:?}.at({offset}, {len}) refused: {e}")
                    }
                    Err(e) => return Err(format!("untyped refusal {e:?}").into()),
                }
                let s = catch_unwind(|| b.slice(offset, len))
                    .map_err(|_| format!("{b:?}.slice({offset}, {len}) panicked"))?;
                ensure!(s.is_ok() == fits, "{b:?}.slice({offset}, {len}): {s:?}");
            }
        }
    }
    Ok(())
}
