//! A peer's registered buffer as programs exchange it: address, rkey and
//! length, with a fixed-length wire record beside
//! [`Endpoint`](crate::qp::Endpoint)'s.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::mr::{AccessFlags, MemoryRegion};
use crate::qp::RemoteAddr;

/// A buffer in a peer's memory that RDMA operations may reach: the
/// address and rkey of a registered region (or a bound memory window) and
/// its length, as the peer announced them.
///
/// [`at`](Self::at) names a place inside it for a work request, refusing
/// anything that does not lie wholly inside; the peer's registration is
/// what protects its memory, this only keeps a program's own offsets
/// honest.
///
/// Its text form is `%016x:%08x:%016x` (address, rkey, length, lower-case
/// hex, fixed widths), and its wire record that text followed by a NUL:
/// 43 bytes, in the style of [`Endpoint::to_wire`](crate::qp::Endpoint::to_wire).
///
/// ```
/// use rdma_verbs::RemoteBuf;
/// let buf = RemoteBuf { addr: 0x7f00_1000, rkey: 0x1234, len: 4096 };
/// let text = buf.to_string();
/// assert_eq!(text, "000000007f001000:00001234:0000000000001000");
/// assert_eq!(RemoteBuf::from_wire(&buf.to_wire())?, buf);
/// let at = buf.at(64, 8)?; // 8 bytes at offset 64
/// assert_eq!((at.addr, at.rkey), (0x7f00_1040, 0x1234));
/// assert!(buf.at(4090, 8).is_err()); // runs past the end
/// # Ok::<(), rdma_verbs::Error>(())
/// ```
#[doc(alias = "ibv_mr")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteBuf {
    /// The peer's address of the buffer's first byte.
    pub addr: u64,
    /// The rkey of the peer's region or window.
    pub rkey: u32,
    /// The buffer's length in bytes.
    pub len: u64,
}

impl RemoteBuf {
    /// Length of the wire record, NUL included.
    pub const WIRE_LEN: usize = 43;

    /// The place `offset` bytes into the buffer, for an operation on `len`
    /// bytes there: refused with [`Error::InvalidArgument`] unless
    /// `offset + len` is within the buffer (computed without overflow) and
    /// the buffer's own end does not wrap around the address space.
    /// `len` may be 0 (an empty RDMA operation), at any offset up to the
    /// buffer's length.
    pub fn at(&self, offset: u64, len: u64) -> Result<RemoteAddr> {
        let (addr, _) = self.range("RemoteBuf::at", offset, len)?;
        Ok(RemoteAddr {
            addr,
            rkey: self.rkey,
        })
    }

    /// The part of the buffer `offset..offset + len`, as a buffer of its
    /// own (to hand a peer less than all of it); refused as
    /// [`at`](Self::at) refuses.
    pub fn slice(&self, offset: u64, len: u64) -> Result<RemoteBuf> {
        let (addr, _) = self.range("RemoteBuf::slice", offset, len)?;
        Ok(RemoteBuf {
            addr,
            rkey: self.rkey,
            len,
        })
    }

    /// Checks `offset..offset + len` and returns its first address and end.
    fn range(&self, verb: &'static str, offset: u64, len: u64) -> Result<(u64, u64)> {
        let refuse = |why: String| Err(Error::invalid(verb, why));
        if self.addr.checked_add(self.len).is_none() {
            return refuse(format!(
                "the buffer {:#x}+{:#x} runs past the end of the address space",
                self.addr, self.len
            ));
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok((self.addr + offset, self.addr + end)),
            _ => refuse(format!(
                "{len} bytes at offset {offset} do not fit in a buffer of {} bytes",
                self.len
            )),
        }
    }

    /// The wire record: the text form and a NUL.
    pub fn to_wire(&self) -> [u8; Self::WIRE_LEN] {
        let mut out = [0u8; Self::WIRE_LEN];
        out[..Self::WIRE_LEN - 1].copy_from_slice(self.to_string().as_bytes());
        out
    }

    /// Parses a wire record: the 42 characters of the text form, then
    /// nothing, a NUL, or a NUL and zero bytes. The last is the connection
    /// manager's padding: the private data of a CM message arrives padded
    /// with zeros to its fixed length ([`CmEvent::private_data`]), and a
    /// record sent in it parses as it arrives.
    ///
    /// Refused with [`Error::InvalidArgument`] naming
    /// `RemoteBuf::from_wire`: fewer than 42 bytes, a non-zero byte after
    /// the text, a sign, upper-case or non-hex digits, and a buffer whose
    /// end wraps around the address space.
    ///
    /// [`CmEvent::private_data`]: https://docs.rs/rdma-verbs/latest/rdma_verbs/cm/struct.CmEvent.html#method.private_data
    pub fn from_wire(bytes: &[u8]) -> Result<Self> {
        const VERB: &str = "RemoteBuf::from_wire";
        const TEXT: usize = RemoteBuf::WIRE_LEN - 1;
        if bytes.len() < TEXT {
            let why = format!("{} bytes, fewer than the {TEXT} of a record", bytes.len());
            return Err(bad_buf(VERB, &why));
        }
        let (text, rest) = bytes.split_at(TEXT);
        if let Some(i) = rest.iter().position(|&b| b != 0) {
            let why = format!(
                "byte {} after the record is {:#04x}, not a NUL or zero padding",
                TEXT + i,
                rest[i]
            );
            return Err(bad_buf(VERB, &why));
        }
        let text = std::str::from_utf8(text).map_err(|_| bad_buf(VERB, "not ASCII"))?;
        parse(VERB, text)
    }
}

/// Parses the text form; refusals name `verb`, the call the caller made.
fn parse(verb: &'static str, s: &str) -> Result<RemoteBuf> {
    let mut parts = s.split(':');
    let addr = hex_field(verb, parts.next(), "ADDR", 16)?;
    let rkey = hex_field(verb, parts.next(), "RKEY", 8)? as u32;
    let len = hex_field(verb, parts.next(), "LEN", 16)?;
    if parts.next().is_some() {
        return Err(bad_buf(verb, "more than three fields"));
    }
    if addr.checked_add(len).is_none() {
        return Err(bad_buf(
            verb,
            "the buffer runs past the end of the address space",
        ));
    }
    Ok(RemoteBuf { addr, rkey, len })
}

#[cold]
fn bad_buf(verb: &'static str, why: &str) -> Error {
    Error::invalid(verb, format!("not an ADDR:RKEY:LEN record: {why}"))
}

/// Parses exactly `digits` lower-case hex digits.
fn hex_field(verb: &'static str, part: Option<&str>, name: &str, digits: usize) -> Result<u64> {
    let p = part.ok_or_else(|| bad_buf(verb, &format!("no {name}")))?;
    let hex = |b: &u8| b.is_ascii_digit() || (b'a'..=b'f').contains(b);
    if p.len() != digits || !p.as_bytes().iter().all(hex) {
        let why = format!("{name} is not {digits} lower-case hex digits");
        return Err(bad_buf(verb, &why));
    }
    u64::from_str_radix(p, 16).map_err(|_| bad_buf(verb, name))
}

impl fmt::Display for RemoteBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}:{:08x}:{:016x}", self.addr, self.rkey, self.len)
    }
}

impl FromStr for RemoteBuf {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        parse("RemoteBuf::from_str", s)
    }
}

impl<B> MemoryRegion<B> {
    /// The whole region as a peer reaches it: its address, rkey and length.
    ///
    /// Refused with [`Error::InvalidArgument`] for a region registered
    /// without `REMOTE_READ`, `REMOTE_WRITE` or `REMOTE_ATOMIC`: a peer's
    /// operation with its rkey would only fail (with a remote access error
    /// that moves both QPs to ERR). A region meant for memory windows
    /// (`MW_BIND`) is reached through the window's rkey instead.
    ///
    /// ```no_run
    /// use rdma_verbs::{AccessFlags, Context};
    /// let pd = Context::open_first()?.alloc_pd()?;
    /// let mr = pd.register(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)?;
    /// let wire = mr.remote_buf()?.to_wire(); // send this to the peer
    /// # Ok::<(), rdma_verbs::Error>(())
    /// ```
    #[doc(alias = "ibv_mr")]
    pub fn remote_buf(&self) -> Result<RemoteBuf> {
        let remote =
            AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
        if !self.access().intersects(remote) {
            return Err(Error::invalid(
                "MemoryRegion::remote_buf",
                format!(
                    "the region was registered with {:?}, without REMOTE_READ, REMOTE_WRITE \
                     or REMOTE_ATOMIC: a peer cannot use its rkey",
                    self.access()
                ),
            ));
        }
        Ok(RemoteBuf {
            addr: self.addr(),
            rkey: self.rkey(),
            len: self.len() as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_record_round_trips() {
        let b = RemoteBuf {
            addr: u64::MAX - 0x10,
            rkey: u32::MAX,
            len: 0x10,
        };
        let w = b.to_wire();
        assert_eq!(w.len(), RemoteBuf::WIRE_LEN);
        assert_eq!(w[42], 0);
        assert_eq!(&w[..42], b"ffffffffffffffef:ffffffff:0000000000000010");
        assert_eq!(RemoteBuf::from_wire(&w).unwrap(), b);
        assert_eq!(RemoteBuf::from_wire(&w[..42]).unwrap(), b);
        assert_eq!(
            w[..42].iter().map(|&c| c as char).collect::<String>(),
            b.to_string()
        );
    }

    #[test]
    fn malformed_records_are_refused() {
        let good = "0000000000001000:00001234:0000000000000100";
        assert!(good.parse::<RemoteBuf>().is_ok());
        for bad in [
            "",
            "0000000000001000:00001234",
            "0000000000001000:00001234:0000000000000100:",
            "000000000001000:00001234:0000000000000100",
            "0000000000001000:0001234:00000000000000100",
            "+000000000001000:00001234:0000000000000100",
            "0000000000001000:+0001234:0000000000000100",
            "0000000000001000:00001234:000000000000010G",
            "0000000000001000:00001234:000000000000010A",
            "0000000000001000 00001234 0000000000000100",
            "ffffffffffffff00:00001234:0000000000000100",
            "0000000000001000:00001234:00000000000001é",
        ] {
            assert!(bad.parse::<RemoteBuf>().is_err(), "{bad:?} accepted");
        }
        let mut w = good.as_bytes().to_vec();
        w.push(0);
        assert!(RemoteBuf::from_wire(&w).is_ok());
        w.push(b'x');
        let e = RemoteBuf::from_wire(&w).unwrap_err().to_string();
        assert!(e.contains("byte 43 after the record is 0x78"), "{e}");
        assert!(RemoteBuf::from_wire(&w[..41]).is_err(), "short");
        assert!(RemoteBuf::from_wire(&[0xff; 43]).is_err(), "not UTF-8");
    }

    /// A record in CM private data arrives padded with zeros to the
    /// message's fixed length (56 bytes of a REQ over InfiniBand, 196 of a
    /// REP): it parses as it arrives, and what goes wrong names from_wire.
    #[test]
    fn private_data_padding_is_accepted_and_errors_name_from_wire() {
        let b = RemoteBuf {
            addr: 0x7f00_1000,
            rkey: 0x1234,
            len: 4096,
        };
        for padded in [56, 196] {
            let mut data = vec![0u8; padded];
            data[..RemoteBuf::WIRE_LEN].copy_from_slice(&b.to_wire());
            assert_eq!(RemoteBuf::from_wire(&data).unwrap(), b);
            data[padded - 1] = 1;
            let e = RemoteBuf::from_wire(&data).unwrap_err().to_string();
            assert!(e.contains("RemoteBuf::from_wire"), "{e}");
            assert!(
                e.contains(&format!("byte {} after the record is 0x01", padded - 1)),
                "{e}"
            );
        }
        let e = RemoteBuf::from_wire(b"0000000000001000:00001234:000000000000010G")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("RemoteBuf::from_wire") && e.contains("LEN"),
            "{e}"
        );
        let e = "x".parse::<RemoteBuf>().unwrap_err().to_string();
        assert!(e.contains("RemoteBuf::from_str"), "{e}");
    }

    #[test]
    fn at_stays_inside() {
        let b = RemoteBuf {
            addr: 0x1000,
            rkey: 7,
            len: 100,
        };
        assert_eq!(b.at(0, 100).unwrap().addr, 0x1000);
        assert_eq!(b.at(100, 0).unwrap().addr, 0x1000 + 100);
        assert!(b.at(100, 1).is_err());
        assert!(b.at(101, 0).is_err());
        assert!(b.at(1, u64::MAX).is_err());
        assert!(b.at(u64::MAX, 2).is_err());
        let s = b.slice(10, 20).unwrap();
        assert_eq!((s.addr, s.rkey, s.len), (0x1000 + 10, 7, 20));
        assert!(s.at(0, 21).is_err());
        let wraps = RemoteBuf {
            addr: u64::MAX,
            rkey: 0,
            len: 2,
        };
        assert!(wraps.at(0, 1).is_err());
    }
}
