//! The crate's one error type, and the one place where C return conventions
//! become `Result`s.

use std::ffi::c_int;
use std::fmt;
use std::io;
use std::ptr::NonNull;

mod reject;

/// Everything that can go wrong in `rdma-verbs`.
///
/// Errors from libibverbs carry the verb that failed and its `errno`;
/// errors caught before any call (bad arguments, unsupported features) say
/// what was wrong, and in that case nothing was changed on the device.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A libibverbs call failed.
    #[error("{verb} failed: {}", io::Error::from_raw_os_error(*.errno))]
    Verb {
        /// The C function that failed, e.g. `"ibv_create_qp"`.
        verb: &'static str,
        /// The `errno` it reported.
        errno: i32,
    },
    /// An argument was refused before any call was made.
    #[error("invalid argument to {verb}: {reason}")]
    InvalidArgument {
        /// The C function the call would have gone to.
        verb: &'static str,
        /// What was wrong with the argument.
        reason: String,
    },
    /// The device does not support what was asked for.
    #[error("{what} is not supported by device {device}{}", errno_suffix(*.errno))]
    Unsupported {
        /// What was asked for, e.g. `"RAW_PACKET queue pairs"`.
        what: &'static str,
        /// The device's name.
        device: String,
        /// The `errno` the device answered with, when it was asked.
        errno: Option<i32>,
    },
    /// A value is outside the domain of its C field (a 25-bit PSN, an ACK
    /// timeout of 32, ...).
    #[error("{what} {value} is out of range {range}")]
    OutOfRange {
        /// What the value is, e.g. `"PSN"`.
        what: &'static str,
        /// The value given.
        value: u64,
        /// The valid range, e.g. `"0..=31"`.
        range: &'static str,
    },
    /// A queue pair modify was refused before the call: an illegal state
    /// transition, a missing or forbidden attribute, or a value the device
    /// or port cannot take. Nothing was sent to the device, with one
    /// exception: when the kernel refused a modify that the checks had
    /// accepted on a cached GID entry which has changed since, the checks
    /// run again on fresh data and their reason is returned in place of the
    /// kernel's errno (see [`QueuePair::modify`](crate::QueuePair::modify)).
    /// Either way the QP is unchanged.
    #[error("{0}")]
    Modify(#[from] crate::qp::ModifyError),
    /// A work request was refused before the call because the queue pair's
    /// known state does not take it (sends below RTS, receives in RESET or
    /// ERR). Nothing was posted; the request's chunks come back with the
    /// error.
    #[error("{verb} refused: the QP is in {}; {needs}", .state.short_name())]
    QpState {
        /// The C function the post would have gone to.
        verb: &'static str,
        /// The QP's known state ([`QueuePair::state`](crate::QueuePair::state)).
        state: crate::qp::QpState,
        /// What the post needs, e.g. `"sends need RTS, SQD, SQE or ERR"`.
        needs: &'static str,
    },
    /// An operation made for QPs of one transport was asked of a QP of
    /// another, e.g. [`QueuePair::bring_up_ud`](crate::QueuePair::bring_up_ud)
    /// on an RC QP (which needs a peer:
    /// [`QueuePair::connect`](crate::QueuePair::connect)). Nothing was
    /// called; the QP is unchanged.
    #[error("{operation} takes {takes} QPs; this QP is {}", .qp_type.short_name())]
    WrongQpType {
        /// The operation, e.g. `"QueuePair::bring_up_ud"`.
        operation: &'static str,
        /// The QP's type.
        qp_type: crate::qp::QpType,
        /// The type(s) the operation takes, e.g. `"UD"`.
        takes: &'static str,
    },
    /// A post was refused before the call: the queue has no room for all
    /// of the call's requests. Nothing was posted, and every chunk comes
    /// back with the [`PostError`](crate::qp::PostError); room comes back
    /// as completions are reclaimed (a queue holds a request until its
    /// completion, or a later send's, is reclaimed).
    #[error(
        "{verb} refused: {requests} request(s) but the {queue} has room for {room} \
         ({outstanding} outstanding)"
    )]
    QueueFull {
        /// The C function the post would have gone to.
        verb: &'static str,
        /// Which queue: `"send queue"`, `"receive queue"` or
        /// `"shared receive queue"`.
        queue: &'static str,
        /// How many requests the call had.
        requests: usize,
        /// How many more requests the queue could take.
        room: usize,
        /// How many requests it holds.
        outstanding: usize,
    },
    /// The process used up the work request numbers this crate hands out
    /// (2^62 of them): no further posts are possible.
    #[error("{verb} refused: the process has used up all 2^62 work request tags")]
    TagsExhausted {
        /// The C function the post would have gone to.
        verb: &'static str,
    },
    /// A wait for a condition on the device ran out of time.
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// How long.
        waited: std::time::Duration,
    },
    /// No device of that name exists.
    #[error("no RDMA device named {0:?}")]
    DeviceNotFound(String),
    /// The system has no RDMA devices at all.
    #[error("no RDMA devices found (is an RDMA driver loaded, e.g. `rdma link add rxe0 type rxe netdev eth0`?)")]
    NoDevices,
    /// `close()` was called on an object that other objects still depend on.
    ///
    /// The object stays alive and is destroyed when its last user is dropped.
    /// The message names the users, e.g. `cannot close the protection
    /// domain now: it is still used by 2 queue pairs, 1 memory region, 1
    /// other handle (a clone); it will be destroyed when the last of them
    /// is dropped`.
    #[error("cannot {} the {object} now: it is still used by {by}; {}", .op.verb(), .op.after())]
    InUse {
        /// What was asked, which says what became of the object.
        op: InUseOp,
        /// Which kind of object, e.g. `"protection domain"`.
        object: &'static str,
        /// How many other handles and objects still hold it, in all.
        users: usize,
        /// Who they are: objects by kind, and the object's own other
        /// handles (clones).
        by: crate::users::InUseBy,
    },
    /// Huge pages were asked for ([`Pages::huge`](crate::Pages::huge)) and
    /// the system could not give them: it has none reserved, too few are
    /// free, or it has no huge pages at all. Nothing was mapped.
    #[error("{bytes} bytes of huge pages asked for: {}", huge_pages_state(*.page_size, *.free, *.total, *.errno))]
    HugePages {
        /// The length asked for.
        bytes: usize,
        /// The system's default huge page size (`Hugepagesize` in
        /// `/proc/meminfo`), 0 when it has none.
        page_size: usize,
        /// Huge pages free when the mapping was refused (`HugePages_Free`).
        free: u64,
        /// Huge pages reserved in all (`HugePages_Total`,
        /// `/proc/sys/vm/nr_hugepages`).
        total: u64,
        /// The `errno` of the refused `mmap(MAP_HUGETLB)`, 0 when it was
        /// not called (no huge pages on this system).
        errno: i32,
    },
    /// A connection manager event other than the one awaited came (or the
    /// awaited one with a non-zero status), e.g. `RDMA_CM_EVENT_ADDR_ERROR`
    /// with `-ETIMEDOUT` in place of `RDMA_CM_EVENT_ADDR_RESOLVED`.
    #[error("waited for {awaited}, got {got}{}", cm_status(.got, *.status))]
    CmEvent {
        /// The event awaited (`rdma_event_str` name).
        awaited: &'static str,
        /// The event that came.
        got: &'static str,
        /// Its status: a negative errno, or a reject reason for
        /// `RDMA_CM_EVENT_REJECTED`.
        status: i32,
    },
    /// A guard of this crate that holds a provider lock (an open
    /// [`WrBatch`](crate::qp::WrBatch) between `ibv_wr_start` and
    /// `ibv_wr_complete`, an open [`CqPoll`](crate::CqPoll) between
    /// `ibv_start_poll` and `ibv_end_poll`) was leaked with
    /// `std::mem::forget`, so the provider still holds that lock. Calling
    /// the provider again on the same queue would spin forever, so the
    /// crate refuses; nothing was called. The error says what the object
    /// can still do (for a QP: receive, RESET and reclaim, close).
    #[error("{verb} refused: {guard} was leaked (std::mem::forget) while open, so the provider still holds {lock}; {can}")]
    GuardLeaked {
        /// The C function the call would have gone to.
        verb: &'static str,
        /// The guard that was leaked, e.g. `"a WrBatch"`.
        guard: &'static str,
        /// The provider lock it holds, e.g. `"the send queue's lock"`.
        lock: &'static str,
        /// What the object can still do.
        can: &'static str,
    },
    /// The connection manager found no RDMA device for an address: the
    /// route starts at an address no RDMA device's network interface has
    /// (127.0.0.1, or a plain Ethernet card's), so
    /// `rdma_resolve_route` failed with `ENODEV`. The CM works only on the
    /// IP addresses of RDMA devices' interfaces (the netdev under a RoCE
    /// device or rxe, an IPoIB interface); the message lists this
    /// machine's.
    #[error(
        "{verb} failed: {}: no RDMA device has {}{}",
        io::Error::from_raw_os_error(*.errno),
        .addr.map_or("the route's source address".to_owned(), |a| format!("the address {a}")),
        usable_list(.usable)
    )]
    NoRdmaAddress {
        /// The C function that failed (`"rdma_resolve_route"`).
        verb: &'static str,
        /// The `errno` it reported (`ENODEV`).
        errno: i32,
        /// The address the route starts at, when the id knows it.
        addr: Option<std::net::IpAddr>,
        /// This machine's addresses that RDMA devices answer to, each as
        /// `"ADDRESS (DEVICE port N)"`: those of RoCE GIDs (InfiniBand
        /// ports' IPoIB addresses are not listed).
        usable: Vec<String>,
    },
    /// libibverbs returned a value this crate does not know how to decode.
    #[error("{verb} returned an unexpected {field} value {value}")]
    Unexpected {
        /// The C function that returned it.
        verb: &'static str,
        /// The field, e.g. `"active_mtu"`.
        field: &'static str,
        /// The raw value.
        value: i64,
    },
}

/// What [`Error::InUse`] refused, and so what became of the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InUseOp {
    /// `close()`: the object stays alive, and is destroyed when the last
    /// of its users is dropped.
    Close,
    /// [`MemoryRegion::into_inner`](crate::MemoryRegion::into_inner) or
    /// [`ChunkedRegion::into_inner`](crate::ChunkedRegion::into_inner):
    /// the region comes back with the error, still registered.
    HandBack,
    /// [`ChunkedRegion::rejoin`](crate::ChunkedRegion::rejoin): the chunked
    /// region comes back with the error.
    Rejoin,
    /// `rereg_*` of a memory region: nothing was changed.
    Rereg,
}

impl InUseOp {
    fn verb(self) -> &'static str {
        match self {
            InUseOp::Close => "close",
            InUseOp::HandBack => "hand back the buffer of",
            InUseOp::Rejoin => "rejoin",
            InUseOp::Rereg => "re-register",
        }
    }

    fn after(self) -> &'static str {
        match self {
            InUseOp::Close => "it will be destroyed when the last of them is dropped",
            InUseOp::HandBack => {
                "it comes back with this error, still registered (Refused::into_value)"
            }
            InUseOp::Rejoin => {
                "the chunked region comes back with this error (Refused::into_value)"
            }
            InUseOp::Rereg => "nothing was changed",
        }
    }
}

fn cm_status(got: &str, status: i32) -> String {
    match status {
        0 => String::new(),
        s if got == "RDMA_CM_EVENT_REJECTED" => format!(" (reject reason {})", reject::describe(s)),
        s if got == "RDMA_CM_EVENT_UNREACHABLE" && s > 0 => {
            format!(" (SIDR status {})", reject::describe_sidr(s))
        }
        s if s < 0 => format!(" ({})", io::Error::from_raw_os_error(-s)),
        s => format!(" (status {s})"),
    }
}

fn usable_list(usable: &[String]) -> String {
    if usable.is_empty() {
        "; this machine's RDMA devices have no IP address (give the network interface under \
         one an address)"
            .to_owned()
    } else {
        format!(
            "; the connection manager needs the address of an RDMA device's network interface: \
             {}",
            usable.join(", ")
        )
    }
}

fn errno_suffix(errno: Option<i32>) -> String {
    match errno {
        Some(e) => format!(" ({})", io::Error::from_raw_os_error(e)),
        None => String::new(),
    }
}

impl Error {
    /// The `errno` behind this error, when it came from libibverbs.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Verb { errno, .. } | Error::NoRdmaAddress { errno, .. } => Some(*errno),
            Error::Unsupported { errno, .. } => *errno,
            Error::CmEvent { status, got, .. }
                if *status < 0 && *got != "RDMA_CM_EVENT_REJECTED" =>
            {
                Some(-*status)
            }
            _ => None,
        }
    }

    /// The name of the C function involved, when there is one.
    pub fn verb(&self) -> Option<&'static str> {
        match self {
            Error::Verb { verb, .. }
            | Error::NoRdmaAddress { verb, .. }
            | Error::InvalidArgument { verb, .. }
            | Error::QpState { verb, .. }
            | Error::QueueFull { verb, .. }
            | Error::TagsExhausted { verb } => Some(verb),
            Error::Unexpected { verb, .. } => Some(verb),
            _ => None,
        }
    }

    pub(crate) fn invalid(verb: &'static str, reason: impl fmt::Display) -> Self {
        Error::InvalidArgument {
            verb,
            reason: reason.to_string(),
        }
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        let kind = match &e {
            Error::Verb { errno, .. } => io::Error::from_raw_os_error(*errno).kind(),
            Error::NoRdmaAddress { .. } => io::ErrorKind::AddrNotAvailable,
            Error::InvalidArgument { .. }
            | Error::OutOfRange { .. }
            | Error::Modify(_)
            | Error::QpState { .. }
            | Error::WrongQpType { .. } => io::ErrorKind::InvalidInput,
            Error::QueueFull { .. } => io::ErrorKind::WouldBlock,
            Error::TagsExhausted { .. } => io::ErrorKind::OutOfMemory,
            Error::Timeout { .. } => io::ErrorKind::TimedOut,
            Error::CmEvent { got, status, .. } => match (*got, *status) {
                ("RDMA_CM_EVENT_REJECTED", _) => io::ErrorKind::ConnectionRefused,
                (_, s) if s < 0 => io::Error::from_raw_os_error(-s).kind(),
                _ => io::ErrorKind::Other,
            },
            Error::Unsupported { .. } => io::ErrorKind::Unsupported,
            Error::DeviceNotFound(_) | Error::NoDevices => io::ErrorKind::NotFound,
            Error::InUse { .. } | Error::GuardLeaked { .. } => io::ErrorKind::ResourceBusy,
            Error::HugePages { .. } => io::ErrorKind::OutOfMemory,
            Error::Unexpected { .. } => io::ErrorKind::InvalidData,
        };
        io::Error::new(kind, e)
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What [`Error::HugePages`] says about the system's huge pages.
fn huge_pages_state(page_size: usize, free: u64, total: u64, errno: i32) -> String {
    if page_size == 0 {
        return "this system has no huge pages (no Hugepagesize in /proc/meminfo)".into();
    }
    format!(
        "{free} of the {total} huge pages of {page_size} bytes reserved are free ({}); \
         reserve more in /proc/sys/vm/nr_hugepages, or use Pages::huge_or_normal",
        io::Error::from_raw_os_error(errno)
    )
}

/// A refused call's error, with what the caller gave it handed back
/// unchanged: the buffer a registration refused
/// ([`ProtectionDomain::register_owned`](crate::ProtectionDomain::register_owned)),
/// the region that could not give its buffer back yet
/// ([`MemoryRegion::into_inner`](crate::MemoryRegion::into_inner)), and
/// so on. `?` turns it into the plain [`Error`] (dropping the value).
///
/// ```no_run
/// use rdma_verbs::{AccessFlags, Context};
/// let pd = Context::open_first()?.alloc_pd()?;
/// match pd.register_owned(Vec::new(), AccessFlags::LOCAL_WRITE) {
///     Ok(_) => unreachable!("an empty buffer is refused"),
///     Err(refused) => {
///         eprintln!("{}", refused.error());
///         let mine: Vec<u8> = refused.into_value(); // the buffer, back
///         # drop(mine);
///     }
/// }
/// # Ok::<(), rdma_verbs::Error>(())
/// ```
pub struct Refused<T> {
    error: Error,
    value: T,
}

impl<T> Refused<T> {
    pub(crate) fn new(error: Error, value: T) -> Self {
        Refused { error, value }
    }

    /// Why the call was refused.
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// What the caller gave, back.
    pub fn into_value(self) -> T {
        self.value
    }

    /// The error and the value.
    pub fn into_parts(self) -> (Error, T) {
        (self.error, self.value)
    }
}

impl<T> From<Refused<T>> for Error {
    fn from(r: Refused<T>) -> Error {
        r.error
    }
}

impl<T> fmt::Debug for Refused<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refused")
            .field("error", &self.error)
            .field("value", &std::any::type_name::<T>())
            .finish()
    }
}

impl<T> fmt::Display for Refused<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

// The message is the error's own, so the source is the error's source
// (naming the error itself would print it twice in a chain).
impl<T> std::error::Error for Refused<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.error)
    }
}

/// The calling thread's `errno`, or `fallback` when it is not set.
pub(crate) fn last_errno(fallback: i32) -> i32 {
    match io::Error::last_os_error().raw_os_error() {
        Some(e) if e != 0 => e,
        _ => fallback,
    }
}

/// Checks a pointer returned by a verb that reports failure as NULL plus
/// `errno` (`ibv_open_device`, `ibv_alloc_pd`, `ibv_create_qp`, ...).
pub(crate) fn check_ptr<T>(verb: &'static str, ptr: *mut T) -> Result<NonNull<T>> {
    NonNull::new(ptr).ok_or_else(|| Error::Verb {
        verb,
        // Some providers return NULL without setting errno; EINVAL is what
        // libibverbs itself uses for "the provider refused".
        errno: last_errno(libc::EINVAL),
    })
}

/// Checks an `int` returned by a verb. libibverbs uses three conventions and
/// this one function reads all of them: 0 is success; a positive value is the
/// errno itself (`ibv_modify_qp`, `ibv_dealloc_pd`, ...); a negative value is
/// either `-1` with `errno` set (`ibv_query_gid`, ...) or `-errno`
/// (`ibv_poll_cq`, ...).
#[inline]
pub(crate) fn check_rc(verb: &'static str, rc: c_int) -> Result<c_int> {
    match rc {
        0 => Ok(0),
        1.. => Err(Error::Verb { verb, errno: rc }),
        -1 => Err(Error::Verb {
            verb,
            errno: last_errno(libc::EINVAL),
        }),
        _ => Err(Error::Verb { verb, errno: -rc }),
    }
}

/// Like [`check_rc`] for verbs whose non-negative result is a count
/// (`ibv_poll_cq`, `ibv_query_gid_table`).
/// Inline: `ibv_poll_cq` goes through it on every poll, and the common
/// case is one compare.
#[inline]
pub(crate) fn check_count(verb: &'static str, rc: c_int) -> Result<usize> {
    if rc >= 0 {
        Ok(rc as usize)
    } else {
        count_failed(verb, rc)
    }
}

/// [`check_count`]'s failure, out of the caller's line.
#[cold]
#[inline(never)]
fn count_failed(verb: &'static str, rc: c_int) -> Result<usize> {
    check_rc(verb, rc).map(|_| 0)
}

/// "table of 1 entry", "table of 16 entries".
pub(crate) fn table_of(len: impl Into<u64>) -> String {
    match len.into() {
        1 => "table of 1 entry".to_owned(),
        n => format!("table of {n} entries"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_rdma_address_names_the_address_and_the_usable_ones() {
        let e = Error::NoRdmaAddress {
            verb: "rdma_resolve_route",
            errno: libc::ENODEV,
            addr: Some("127.0.0.1".parse().unwrap()),
            usable: vec![
                "10.0.2.15 (rxe0 port 1)".into(),
                "fd00::2 (rxe0 port 1)".into(),
            ],
        };
        let m = e.to_string();
        assert!(
            m.starts_with("rdma_resolve_route failed: No such device"),
            "{m}"
        );
        assert!(
            m.contains("no RDMA device has the address 127.0.0.1"),
            "{m}"
        );
        assert!(
            m.ends_with("interface: 10.0.2.15 (rxe0 port 1), fd00::2 (rxe0 port 1)"),
            "{m}"
        );
        assert_eq!(e.errno(), Some(libc::ENODEV));
        let none = Error::NoRdmaAddress {
            verb: "rdma_resolve_route",
            errno: libc::ENODEV,
            addr: None,
            usable: vec![],
        };
        let m = none.to_string();
        assert!(
            m.contains("the route's source address") && m.contains("have no IP address"),
            "{m}"
        );
    }

    #[test]
    fn positive_rc_is_the_errno() {
        let e = check_rc("ibv_modify_qp", libc::EINVAL).unwrap_err();
        assert_eq!(e.errno(), Some(libc::EINVAL));
        assert_eq!(e.verb(), Some("ibv_modify_qp"));
        assert!(e
            .to_string()
            .starts_with("ibv_modify_qp failed: Invalid argument"));
    }

    #[test]
    fn negative_rc_is_minus_errno() {
        let e = check_rc("ibv_poll_cq", -libc::ENOMEM).unwrap_err();
        assert_eq!(e.errno(), Some(libc::ENOMEM));
        assert_eq!(check_count("ibv_poll_cq", 3).unwrap(), 3);
        assert!(check_count("ibv_poll_cq", -libc::EIO).is_err());
    }

    #[test]
    fn minus_one_reads_errno() {
        // SAFETY: __errno_location returns this thread's errno slot.
        unsafe { *libc::__errno_location() = libc::ENODATA };
        let e = check_rc("ibv_query_gid", -1).unwrap_err();
        assert_eq!(e.errno(), Some(libc::ENODATA));
    }

    #[test]
    fn null_pointer_is_an_error() {
        // SAFETY: see above.
        unsafe { *libc::__errno_location() = libc::ENOMEM };
        let e = check_ptr::<u8>("ibv_alloc_pd", std::ptr::null_mut()).unwrap_err();
        assert_eq!(e.errno(), Some(libc::ENOMEM));
        let mut x = 0u8;
        assert!(check_ptr("ibv_alloc_pd", &mut x as *mut u8).is_ok());
    }

    #[test]
    fn io_error_conversion_keeps_the_kind() {
        let e: io::Error = Error::NoDevices.into();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let e: io::Error = Error::Verb {
            verb: "x",
            errno: libc::ENOMEM,
        }
        .into();
        assert_eq!(e.kind(), io::ErrorKind::OutOfMemory);
    }
}
