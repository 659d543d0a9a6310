//! The one helper for a descriptor's `O_NONBLOCK` flag (completion
//! channels, the async event descriptor, CM event channels).

use std::os::fd::RawFd;

use crate::error::{Error, Result};

/// Sets (`on`) or clears `O_NONBLOCK` on `fd`; returns whether it was set
/// before (to put it back when a later step fails).
pub(crate) fn set_nonblocking(fd: RawFd, on: bool) -> Result<bool> {
    // SAFETY: fcntl on a descriptor the caller keeps open; F_GETFL and
    // F_SETFL read and change only its status flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(fcntl_failed());
    }
    let was = flags & libc::O_NONBLOCK != 0;
    if was != on {
        let flags = if on {
            flags | libc::O_NONBLOCK
        } else {
            flags & !libc::O_NONBLOCK
        };
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } != 0 {
            return Err(fcntl_failed());
        }
    }
    Ok(was)
}

#[cold]
fn fcntl_failed() -> Error {
    Error::Verb {
        verb: "fcntl",
        errno: crate::error::last_errno(libc::EIO),
    }
}
