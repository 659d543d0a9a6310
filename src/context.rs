//! An open device (`struct ibv_context`): the parent of every other object.

use std::ffi::{c_int, OsString};
use std::fmt;
use std::ops::RangeInclusive;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use crate::device::{DeviceList, ListInner};
use crate::device_attr::DeviceAttr;
use crate::error::{check_count, check_ptr, check_rc, table_of, Error, Result};
use crate::gid::{Gid, GidEntry};
use crate::handle::{close_counted, Owned, RawObject};
use crate::port::{GidKind, GidPick, PortAttr, PortCache, PortFixed};
use crate::sys;
use crate::users::UserCounts;

impl RawObject for sys::ibv_context {
    const DESTROY: &'static str = "ibv_close_device";
    const NAME: &'static str = "device context";
    unsafe fn destroy(ptr: *mut Self) -> c_int {
        // SAFETY: the caller (`Owned`) passes a live context, once.
        unsafe { sys::ibv_close_device(ptr) }
    }
}

/// What a context keeps alive and caches.
pub(crate) struct ContextData {
    /// What keeps the context's `ibv_device` alive: the device list it lives
    /// in, or for a context librdmacm opened, librdmacm's hold on it.
    _hold: Box<dyn std::any::Any + Send + Sync>,
    name: String,
    attr: DeviceAttr,
    /// What the validator reads of each port, without a call.
    ports: PortCache,
    /// The memory windows allocated on the context (weakly), so that a
    /// peer's invalidation seen in a receive completion reaches the window
    /// its rkey names, whichever PD, QP or SRQ the completion came through
    /// (rkeys are unique on a device).
    windows: Mutex<Vec<Weak<crate::mw::MwInner>>>,
    /// The QPs created from this context, for the event delivery (see
    /// `qp/known.rs`).
    qps: crate::qp::QpRegistry,
    /// Its users by kind, for `close`'s refusal.
    users: Arc<UserCounts>,
}

impl ContextData {
    fn new(hold: Box<dyn std::any::Any + Send + Sync>, name: String, attr: DeviceAttr) -> Self {
        let ports = PortCache::new(u8::try_from(attr.phys_port_cnt).unwrap_or(u8::MAX));
        ContextData {
            _hold: hold,
            name,
            attr,
            ports,
            windows: Mutex::new(Vec::new()),
            qps: Default::default(),
            users: UserCounts::new(),
        }
    }
}

pub(crate) type ContextInner = Owned<sys::ibv_context, ContextData>;

/// An open RDMA device (`struct ibv_context`).
///
/// Every object created from it (PDs, CQs, QPs, ...) holds a reference to it,
/// so it is closed only when the last of them is dropped.
///
/// # What a context caches
///
/// * The device attributes ([`attr`](Self::attr)), read when it is opened.
/// * Per port, the attributes that are fixed while it is open: the P_Key
///   and GID table lengths (the kernel's immutable port data), the link
///   layer and `IBV_QPF_GRH_REQUIRED` (also immutable port data), and the
///   max MTU (the port's capability). They are filled by the first
///   [`query_port`](Self::query_port) of the port, whoever makes it, and
///   refreshed by every later one.
/// * Per GID table entry read, whether it was used and, for RoCE v2,
///   whether it is IPv4-mapped; refreshed by every read of the entry and
///   by [`gid_table`](Self::gid_table).
/// * Per port, the *default GID pick*: the entry
///   [`QueuePair::local_endpoint`](crate::QueuePair::local_endpoint) and
///   [`QueuePair::connect`](crate::QueuePair::connect) use when
///   [`ConnectOptions::gid_index`](crate::qp::ConnectOptions::gid_index)
///   is `None` on a port that needs a GRH (the first RoCE v2 GID, an
///   IPv4-mapped one if there is one), its index and GID. It goes stale
///   when an IP address behind it leaves the port's network device (RoCE
///   GIDs follow the addresses), or a better one arrives. Made from the
///   whole table when first needed and by every
///   [`gid_table`](Self::gid_table) (the explicit refresh); forgotten by
///   an `IBV_EVENT_GID_CHANGE` read with
///   [`get_async_event`](Self::get_async_event) and by any read that finds
///   its entry empty. Kept true without events by a cheap check: every
///   `local_endpoint` re-reads the one entry it names (one
///   `ibv_query_gid_ex`) and, if that entry no longer holds the GID, picks
///   again from the whole table, so no GID that has left the table is
///   handed to a peer. `connect` takes the pick as cached (no call): the
///   kernel judges the entry at RTR, and a refusal is checked again on
///   fresh data. An address added meanwhile at a lower index is picked
///   only after a refresh (the cached pick is still a valid GID).
/// * Per port, the LID the last [`query_port`](Self::query_port) read, for
///   `local_endpoint` on InfiniBand (RoCE has no LIDs: its endpoints carry
///   0 without a call, the link layer being fixed). It goes stale when the
///   subnet manager assigns another; refreshed by every `query_port`
///   (including `connect`'s, below), and forgotten (read again when next
///   needed) by an `IBV_EVENT_LID_CHANGE`, `PORT_ACTIVE`, `PORT_ERR`,
///   `SM_CHANGE` or `CLIENT_REREGISTER` read with
///   [`get_async_event`](Self::get_async_event). There is no cheaper check
///   than `ibv_query_port` itself: a program on InfiniBand that reads no
///   async events should call `query_port` after a subnet change.
///
/// [`QueuePair::modify`](crate::QueuePair::modify)'s checks, and the index
/// checks of [`query_gid`](Self::query_gid),
/// [`query_gid_entry`](Self::query_gid_entry) and
/// [`query_pkey`](Self::query_pkey), read the cache instead of the device,
/// but only to *accept*: a refusal is always made on freshly read data
/// (the port is queried again, the GID entry read again). The port state
/// and the active MTU, which change with the link, are not cached:
/// [`query_port`](Self::query_port) always asks the device, and so does
/// `connect` for the path MTU when
/// [`ConnectOptions::path_mtu`](crate::qp::ConnectOptions::path_mtu) is
/// `None` (no event reports a RoCE MTU change; give the MTU to skip that
/// call, as one agreed with the peer should be anyway).
///
/// ```no_run
/// use rdma_verbs::Context;
/// let ctx = Context::open("rxe0")?;
/// let port = ctx.query_port(1)?;
/// println!("{}: port 1 is {} with MTU {}", ctx.name(), port.state, port.active_mtu.bytes());
/// # Ok::<(), rdma_verbs::Error>(())
/// ```
#[doc(alias = "ibv_context")]
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

impl Context {
    /// Opens the device called `name`.
    #[doc(alias = "ibv_open_device")]
    pub fn open(name: &str) -> Result<Self> {
        DeviceList::new()?.find(name)?.open()
    }

    /// Opens the first device libibverbs lists.
    #[doc(alias = "ibv_open_device")]
    pub fn open_first() -> Result<Self> {
        DeviceList::new()?.get(0).ok_or(Error::NoDevices)?.open()
    }

    /// Opens `dev`: the one place every way of opening a device
    /// ([`open`](Self::open), [`open_first`](Self::open_first),
    /// [`Device::open`](crate::Device::open)) goes through.
    ///
    /// Refused before `ibv_open_device` while a provider's "single threaded"
    /// switch is set in the environment (see [`provider_locks_off`]).
    pub(crate) fn from_device(dev: NonNull<sys::ibv_device>, list: Arc<ListInner>) -> Result<Self> {
        // SAFETY: `dev` is a live device of `list`, which the caller keeps
        // alive; the name is a NUL-terminated array inside it.
        let name = unsafe { std::ffi::CStr::from_ptr(sys::ibv_get_device_name(dev.as_ptr())) }
            .to_string_lossy()
            .into_owned();
        if let Some((var, provider)) = provider_locks_off(|v| std::env::var_os(v)) {
            return Err(Error::invalid(
                "ibv_open_device",
                format!(
                    "refusing to open {name}: {var}=1 is set in the environment, which turns \
                     off the internal locks of the {provider} provider that this crate's \
                     Send + Sync objects rely on; unset it (the crate cannot tell which \
                     provider serves a device, so it refuses for every device)"
                ),
            ));
        }
        // SAFETY: `dev` is a live device of `list`, which the caller keeps alive.
        let raw = check_ptr("ibv_open_device", unsafe {
            sys::ibv_open_device(dev.as_ptr())
        })?;
        let attr = match query_device_raw(raw.as_ptr()) {
            Ok(attr) => attr,
            Err(e) => {
                // SAFETY: `raw` was just opened and is owned by nobody else.
                unsafe { sys::ibv_close_device(raw.as_ptr()) };
                return Err(e);
            }
        };
        let data = ContextData::new(Box::new(list), name, attr);
        // SAFETY: `raw` is a fresh context owned by nobody else; `data` keeps
        // its device list alive.
        let inner = unsafe { Owned::new(raw, data) };
        Ok(Context {
            inner: Arc::new(inner),
        })
    }

    /// Wraps a context that librdmacm opened (`rdma_cm_id::verbs`); `hold`
    /// keeps it open in librdmacm and is dropped in place of closing it.
    ///
    /// # Safety
    /// `raw` is a live context that stays open while `hold` lives.
    #[cfg(feature = "cm")]
    pub(crate) unsafe fn from_borrowed(
        raw: NonNull<sys::ibv_context>,
        hold: Box<dyn std::any::Any + Send + Sync>,
    ) -> Result<Self> {
        // SAFETY: `raw` is live (the caller's promise); its device is a
        // field of it, with a NUL-terminated name.
        let name =
            unsafe { std::ffi::CStr::from_ptr(sys::ibv_get_device_name((*raw.as_ptr()).device)) }
                .to_string_lossy()
                .into_owned();
        let attr = query_device_raw(raw.as_ptr())?;
        let data = ContextData::new(hold, name, attr);
        // SAFETY: `raw` stays open while `data` (which owns `hold`) lives.
        let inner = unsafe { Owned::borrowed(raw, data) };
        Ok(Context {
            inner: Arc::new(inner),
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_context {
        self.inner.as_ptr()
    }

    /// The context's user counts, for its children's tallies.
    pub(crate) fn users(&self) -> &Arc<UserCounts> {
        &self.inner.keep().users
    }

    /// The QPs created from this context, by pointer.
    pub(crate) fn qp_registry(&self) -> &crate::qp::QpRegistry {
        &self.inner.keep().qps
    }

    /// The device's name, e.g. `"rxe0"`.
    #[doc(alias = "ibv_get_device_name")]
    pub fn name(&self) -> &str {
        &self.inner.keep().name
    }

    /// The device attributes, as queried when the context was opened.
    ///
    /// Limits do not change while a device is open; use
    /// [`query_device`](Self::query_device) for a fresh copy.
    pub fn attr(&self) -> &DeviceAttr {
        &self.inner.keep().attr
    }

    /// Whether the device is soft-RoCE (rxe), whose provider has quirks the
    /// crate works around: the kernel's `RXE_VENDOR_ID` (0xffffff, in
    /// drivers/infiniband/sw/rxe/rxe_param.h) is its vendor id.
    pub(crate) fn is_rxe(&self) -> bool {
        self.attr().vendor_id == 0x00ff_ffff
    }

    /// Queries the device attributes.
    #[doc(alias = "ibv_query_device_ex")]
    #[doc(alias = "ibv_query_device")]
    pub fn query_device(&self) -> Result<DeviceAttr> {
        query_device_raw(self.as_ptr())
    }

    /// How many completion vectors the device has (`num_comp_vectors`).
    pub fn num_comp_vectors(&self) -> u32 {
        // SAFETY: the context is live; plain field read of a value set at open.
        u32::try_from(unsafe { (*self.as_ptr()).num_comp_vectors }).unwrap_or(0)
    }

    /// The device's port numbers: `1..=phys_port_cnt`.
    pub fn ports(&self) -> RangeInclusive<u8> {
        1..=u8::try_from(self.attr().phys_port_cnt).unwrap_or(u8::MAX)
    }

    /// Why `port` is not one of this device's ports, if it is not.
    pub(crate) fn port_problem(&self, port: u8) -> Option<String> {
        let ports = self.ports();
        (!ports.contains(&port)).then(|| {
            format!(
                "port {port} does not exist: {} has ports {}..={}",
                self.name(),
                ports.start(),
                ports.end()
            )
        })
    }

    pub(crate) fn check_port(&self, verb: &'static str, port: u8) -> Result<()> {
        match self.port_problem(port) {
            None => Ok(()),
            Some(reason) => Err(Error::invalid(verb, reason)),
        }
    }

    /// Queries port `port` (numbered from 1).
    #[doc(alias = "ibv_query_port")]
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        self.check_port("ibv_query_port", port)?;
        let mut raw = sys::ibv_port_attr::default();
        // SAFETY: the context is live and `raw` is a valid out-pointer. This is
        // verbs.h's inline `ibv_query_port`, which fills the whole current struct.
        let rc = unsafe { sys::___ibv_query_port(self.as_ptr(), port, &mut raw) };
        check_rc("ibv_query_port", rc)?;
        let attr = PortAttr::from_raw(&raw)?;
        self.inner.keep().ports.store(port, &attr);
        Ok(attr)
    }

    /// The attributes of `port` that are fixed while the context is open
    /// ([`PortFixed`]): from the cache, or (`fresh`, or never read) from
    /// [`query_port`](Self::query_port), which refreshes the cache.
    #[inline]
    pub(crate) fn port_fixed(&self, port: u8, fresh: bool) -> Result<PortFixed> {
        match self.cached_port(port) {
            // A port is cached only if it exists.
            Some(f) if !fresh => Ok(f),
            _ => self.read_port_fixed(port),
        }
    }

    #[cold]
    fn read_port_fixed(&self, port: u8) -> Result<PortFixed> {
        self.check_port("ibv_query_port", port)?;
        self.query_port(port).map(|a| PortFixed::of(&a))
    }

    /// The cached [`PortFixed`] of `port`, if it was read: one atomic load,
    /// no call. `None` for a port that does not exist.
    #[inline]
    pub(crate) fn cached_port(&self, port: u8) -> Option<PortFixed> {
        self.inner.keep().ports.fixed(port)
    }

    /// The kind of GID entry `index` of `port` when it was last read and
    /// found used, if it was.
    #[inline]
    pub(crate) fn cached_gid(&self, port: u8, index: u32) -> Option<GidKind> {
        self.inner.keep().ports.gid(port, index)
    }

    /// Forgets what the cache knows of `port`'s GID entries and its default
    /// GID pick (after an `IBV_EVENT_GID_CHANGE`): each is read again when
    /// next needed.
    pub(crate) fn forget_cached_gids(&self, port: u8) {
        self.inner.keep().ports.forget_gids(port);
    }

    /// The context's per-port cache.
    #[inline]
    pub(crate) fn port_cache(&self) -> &PortCache {
        &self.inner.keep().ports
    }

    /// Checks `index` against the GID table's length, which is fixed while
    /// the context is open: the cached length accepts, a refusal re-reads it.
    fn check_gid_index(&self, verb: &'static str, port: u8, index: u32) -> Result<()> {
        if index < self.port_fixed(port, false)?.gid_tbl_len {
            return Ok(());
        }
        let len = self.port_fixed(port, true)?.gid_tbl_len;
        if index < len {
            Ok(())
        } else {
            Err(Error::invalid(
                verb,
                format!(
                    "GID index {index} is outside port {port}'s {}",
                    table_of(len)
                ),
            ))
        }
    }

    /// Checks that entry `index` of `port`'s GID table is used, as
    /// [`query_gid`](Self::query_gid) would (same errors), but without a
    /// call when the cache holds the entry as used (the kernel judges the
    /// entry again when it is used); anything else reads it.
    pub(crate) fn check_gid_used(&self, port: u8, index: u32) -> Result<()> {
        if self.cached_gid(port, index).is_some() {
            // Only an index inside the table is ever cached.
            return Ok(());
        }
        self.query_gid(port, index).map(|_| ())
    }

    /// Reads entry `index` of port `port`'s GID table.
    ///
    /// An empty (unused) entry is an error, [`Error::InvalidArgument`]
    /// naming the index and the port, never the all-zero GID that
    /// libibverbs' `ibv_query_gid` reports for it: a zero GID is no address
    /// to hand a peer.
    #[doc(alias = "ibv_query_gid")]
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        const VERB: &str = "ibv_query_gid";
        self.check_gid_index(VERB, port, index)?;
        // ibv_query_gid_ex tells an unused entry apart (ENODATA), where
        // ibv_query_gid hides it as zeroes; the latter is the fallback for a
        // provider or kernel without the extended query.
        match self.raw_gid_entry(VERB, port, index) {
            Ok(raw) => Ok(Gid::from_raw(&raw.gid)),
            Err(e) if matches!(e.errno(), Some(libc::EOPNOTSUPP | libc::ENOSYS)) => {
                let mut raw = sys::ibv_gid::default();
                // SAFETY: live context, valid out-pointer; index is < gid_tbl_len
                // (checked above), so it fits in c_int.
                let rc =
                    unsafe { sys::ibv_query_gid(self.as_ptr(), port, index as c_int, &mut raw) };
                check_rc(VERB, rc)?;
                let gid = Gid::from_raw(&raw);
                if gid.is_zero() {
                    return Err(self.empty_gid_entry(VERB, port, index));
                }
                Ok(gid)
            }
            Err(e) => Err(e),
        }
    }

    /// Reads entry `index` of port `port`'s GID table with its type.
    ///
    /// An empty (unused) entry is the same error as for
    /// [`query_gid`](Self::query_gid): [`Error::InvalidArgument`] naming the
    /// index and the port.
    #[doc(alias = "ibv_query_gid_ex")]
    pub fn query_gid_entry(&self, port: u8, index: u32) -> Result<GidEntry> {
        const VERB: &str = "ibv_query_gid_ex";
        self.check_gid_index(VERB, port, index)?;
        self.raw_gid_entry(VERB, port, index)
            .map(|raw| GidEntry::from_raw(&raw))
    }

    /// `ibv_query_gid_ex` of an index the caller checked is inside the
    /// table; an unused entry (ENODATA, or an all-zero GID) becomes
    /// [`empty_gid_entry`](Self::empty_gid_entry).
    pub(crate) fn raw_gid_entry(
        &self,
        verb: &'static str,
        port: u8,
        index: u32,
    ) -> Result<sys::ibv_gid_entry> {
        let mut raw = sys::ibv_gid_entry::default();
        // SAFETY: live context, valid out-pointer, flags must be 0.
        let rc = unsafe { sys::ibv_query_gid_ex(self.as_ptr(), port.into(), index, &mut raw, 0) };
        let cache = &self.inner.keep().ports;
        match check_rc("ibv_query_gid_ex", rc) {
            Ok(_) if Gid::from_raw(&raw.gid).is_zero() => {
                cache.store_gid(port, index, None);
                Err(self.empty_gid_entry(verb, port, index))
            }
            Ok(_) => {
                cache.store_gid(port, index, Some(GidKind::of(&GidEntry::from_raw(&raw))));
                Ok(raw)
            }
            Err(e) if e.errno() == Some(libc::ENODATA) => {
                cache.store_gid(port, index, None);
                Err(self.empty_gid_entry(verb, port, index))
            }
            Err(e) => Err(e),
        }
    }

    /// The error for an empty (unused) GID table entry.
    fn empty_gid_entry(&self, verb: &'static str, port: u8, index: u32) -> Error {
        Error::invalid(
            verb,
            format!(
                "GID index {index} of port {port} is an empty (unused) entry of {}'s GID table",
                self.name()
            ),
        )
    }

    /// Every valid GID table entry of every port, with its type.
    #[doc(alias = "ibv_query_gid_table")]
    pub fn gid_table(&self) -> Result<Vec<GidEntry>> {
        let mut max = 0usize;
        for port in self.ports() {
            max += self.port_fixed(port, false)?.gid_tbl_len as usize;
        }
        let mut raw = vec![sys::ibv_gid_entry::default(); max];
        // SAFETY: live context; `raw` has room for `max` entries; flags must be 0.
        let n = unsafe { sys::ibv_query_gid_table(self.as_ptr(), raw.as_mut_ptr(), max, 0) };
        let n = check_count("ibv_query_gid_table", n as c_int)?;
        let table: Vec<GidEntry> = raw[..n.min(max)].iter().map(GidEntry::from_raw).collect();
        // The table lists the used entries: the others are empty now. Each
        // port's default GID pick is made again from it.
        let cache = &self.inner.keep().ports;
        for port in self.ports() {
            cache.forget_gids(port);
        }
        for e in &table {
            if let Ok(port) = u8::try_from(e.port) {
                cache.store_gid(port, e.index, Some(GidKind::of(e)));
            }
        }
        for port in self.ports() {
            cache.set_pick(port, GidPick::of(&table, port));
        }
        Ok(table)
    }

    /// Reads entry `index` of port `port`'s P_Key table.
    #[doc(alias = "ibv_query_pkey")]
    pub fn query_pkey(&self, port: u8, index: u16) -> Result<u16> {
        // The table's length is fixed while the context is open: the cached
        // one accepts, a refusal re-reads it.
        let mut len = self.port_fixed(port, false)?.pkey_tbl_len;
        if index >= len {
            len = self.port_fixed(port, true)?.pkey_tbl_len;
        }
        if index >= len {
            return Err(Error::invalid(
                "ibv_query_pkey",
                format!(
                    "P_Key index {index} is outside port {port}'s {}",
                    table_of(len)
                ),
            ));
        }
        let mut pkey: sys::__be16 = 0;
        // SAFETY: live context, valid out-pointer, index inside the table.
        let rc = unsafe { sys::ibv_query_pkey(self.as_ptr(), port, index.into(), &mut pkey) };
        check_rc("ibv_query_pkey", rc)?;
        Ok(u16::from_be(pkey))
    }

    /// Closes the device now, reporting failure.
    ///
    /// Fails with [`Error::InUse`] while other handles to this context, or
    /// objects created from it, are alive (the error names them: protection
    /// domains, completion queues, completion channels, queue pairs, CM
    /// ids, other handles); it is then closed when the last of them is
    /// dropped. Dropping a `Context` never fails visibly.
    #[doc(alias = "ibv_close_device")]
    pub fn close(self) -> Result<()> {
        close_counted(self.inner, |k| Some(&k.users))
    }

    /// Whether `other` is a handle to the same open device context.
    /// Whether `self` and `other` are handles of one open context (so that
    /// objects of one can be used with objects of the other). Two
    /// [`open`](Self::open)s of one device are two contexts; every CM id on
    /// a device shares one ([`CmId::context`](crate::cm::CmId::context),
    /// with the `cm` feature).
    pub fn same_as(&self, other: &Context) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Records a memory window allocated on this context (dropping the
    /// records of windows gone).
    pub(crate) fn add_window(&self, mw: &Arc<crate::mw::MwInner>) {
        let mut w = self.windows();
        w.retain(|x| x.strong_count() > 0);
        w.push(Arc::downgrade(mw));
    }

    /// The records of the memory windows allocated on this context.
    pub(crate) fn windows(&self) -> MutexGuard<'_, Vec<Weak<crate::mw::MwInner>>> {
        self.inner
            .keep()
            .windows
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Environment variables with which a provider turns its internal locks off,
/// each with the provider that reads it. The crate's `Send + Sync` rests on
/// those locks (see the crate docs, "Lifetimes and threads"), so no context
/// is opened while one of them is in effect.
///
/// * `MLX5_SINGLE_THREADED`: rdma-core's mlx5 provider (`providers/mlx5`),
///   read when a context is opened into a process-wide flag: its spinlocks
///   (CQ, QP send and receive queues, SRQ, doorbell registers) become a
///   plain "in use" flag that catches some concurrent use, by aborting the
///   process, and lets the rest race.
/// * `MLX4_SINGLE_THREADED`: the mlx4 provider of Mellanox OFED (the
///   older libmlx4); rdma-core's own mlx4 provider does not read it.
/// * `BNXT_SINGLE_THREADED`: Broadcom's own bnxt_re provider (shipped with
///   their driver bundle); rdma-core's bnxt_re does not read it.
///
/// Each is honoured only with the exact value `1` (the providers compare
/// with `strcmp(value, "1")`); any other value leaves the locks on.
pub(crate) const PROVIDER_LOCK_SWITCHES: &[(&str, &str)] = &[
    ("MLX5_SINGLE_THREADED", "mlx5"),
    ("MLX4_SINGLE_THREADED", "mlx4 (Mellanox OFED)"),
    ("BNXT_SINGLE_THREADED", "bnxt_re (Broadcom)"),
];

/// The first of [`PROVIDER_LOCK_SWITCHES`] that `lookup` (an environment
/// lookup) reports in effect, with its provider: `None` when every
/// provider keeps its locks. A pure function of `lookup`, so that it can be
/// tested without touching the process environment.
pub(crate) fn provider_locks_off(
    lookup: impl Fn(&str) -> Option<OsString>,
) -> Option<(&'static str, &'static str)> {
    PROVIDER_LOCK_SWITCHES
        .iter()
        .copied()
        .find(|(var, _)| lookup(var).is_some_and(|value| value == "1"))
}

fn query_device_raw(ctx: *mut sys::ibv_context) -> Result<DeviceAttr> {
    let mut ex = sys::ibv_device_attr_ex::default();
    // SAFETY: `ctx` is live; `ex` is a valid out-pointer of the size the inline
    // wrapper passes on; a NULL input is allowed. The wrapper falls back to
    // ibv_query_device for providers without the extended verb.
    let rc = unsafe { sys::ibv_query_device_ex(ctx, std::ptr::null(), &mut ex) };
    check_rc("ibv_query_device_ex", rc)?;
    Ok(DeviceAttr::from_raw(&ex))
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("name", &self.name())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An environment lookup over fixed pairs.
    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |var| {
            pairs
                .iter()
                .find(|(k, _)| *k == var)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn lock_switches_need_exactly_one() {
        assert_eq!(provider_locks_off(env(&[])), None);
        assert_eq!(
            provider_locks_off(env(&[("MLX5_SINGLE_THREADED", "1")])),
            Some(("MLX5_SINGLE_THREADED", "mlx5"))
        );
        // strcmp(value, "1") in the providers: nothing else turns locks off.
        for other in ["0", "", " 1", "1 ", "01", "true", "yes", "11"] {
            assert_eq!(
                provider_locks_off(env(&[("MLX5_SINGLE_THREADED", other)])),
                None,
                "{other:?}"
            );
        }
        assert_eq!(
            provider_locks_off(env(&[("MLX4_SINGLE_THREADED", "1")])).map(|(v, _)| v),
            Some("MLX4_SINGLE_THREADED")
        );
        assert_eq!(
            provider_locks_off(env(&[
                ("MLX5_SINGLE_THREADED", "0"),
                ("BNXT_SINGLE_THREADED", "1")
            ]))
            .map(|(v, _)| v),
            Some("BNXT_SINGLE_THREADED")
        );
        // Look-alikes are not read by any provider.
        assert_eq!(
            provider_locks_off(env(&[
                ("RXE_SINGLE_THREADED", "1"),
                ("MLX5_SHUT_UP_BF", "1")
            ])),
            None
        );
    }

    #[test]
    fn a_non_utf8_value_is_not_one() {
        use std::os::unix::ffi::OsStringExt;
        let lookup = |var: &str| {
            (var == "MLX5_SINGLE_THREADED").then(|| OsString::from_vec(vec![b'1', 0xff]))
        };
        assert_eq!(provider_locks_off(lookup), None);
    }
}
