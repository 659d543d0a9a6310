//! An open device (`struct ibv_context`): the parent of every other object.

use std::ffi::c_int;
use std::fmt;
use std::ops::RangeInclusive;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::device::{DeviceList, ListInner};
use crate::device_attr::DeviceAttr;
use crate::error::{check_count, check_ptr, check_rc, Error, Result};
use crate::gid::{Gid, GidEntry};
use crate::handle::{close_shared, Owned, RawObject};
use crate::port::PortAttr;
use crate::sys;

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
    /// The device list the context's `ibv_device` lives in.
    _list: Arc<ListInner>,
    name: String,
    attr: DeviceAttr,
}

pub(crate) type ContextInner = Owned<sys::ibv_context, ContextData>;

/// An open RDMA device (`struct ibv_context`).
///
/// Every object created from it (PDs, CQs, QPs, ...) holds a reference to it,
/// so it is closed only when the last of them is dropped.
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

    pub(crate) fn from_device(dev: NonNull<sys::ibv_device>, list: Arc<ListInner>) -> Result<Self> {
        // SAFETY: `dev` is a live device of `list`, which the caller keeps alive.
        let raw = check_ptr("ibv_open_device", unsafe {
            sys::ibv_open_device(dev.as_ptr())
        })?;
        // SAFETY: `dev` as above; the name is a NUL-terminated array inside it.
        let name = unsafe { std::ffi::CStr::from_ptr(sys::ibv_get_device_name(dev.as_ptr())) }
            .to_string_lossy()
            .into_owned();
        let attr = match query_device_raw(raw.as_ptr()) {
            Ok(attr) => attr,
            Err(e) => {
                // SAFETY: `raw` was just opened and is owned by nobody else.
                unsafe { sys::ibv_close_device(raw.as_ptr()) };
                return Err(e);
            }
        };
        let data = ContextData {
            _list: list,
            name,
            attr,
        };
        // SAFETY: `raw` is a fresh context owned by nobody else; `data` keeps
        // its device list alive.
        let inner = unsafe { Owned::new(raw, data) };
        Ok(Context {
            inner: Arc::new(inner),
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_context {
        self.inner.as_ptr()
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
        PortAttr::from_raw(&raw)
    }

    fn check_gid_index(&self, verb: &'static str, port: u8, index: u32) -> Result<()> {
        let len = self.query_port(port)?.gid_tbl_len;
        if index < len {
            Ok(())
        } else {
            Err(Error::invalid(
                verb,
                format!("GID index {index} is outside port {port}'s table of {len} entries"),
            ))
        }
    }

    /// Reads entry `index` of port `port`'s GID table.
    #[doc(alias = "ibv_query_gid")]
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        self.check_gid_index("ibv_query_gid", port, index)?;
        let mut raw = sys::ibv_gid::default();
        // SAFETY: live context, valid out-pointer; index is < gid_tbl_len so it fits in c_int.
        let rc = unsafe { sys::ibv_query_gid(self.as_ptr(), port, index as c_int, &mut raw) };
        check_rc("ibv_query_gid", rc)?;
        Ok(Gid::from_raw(&raw))
    }

    /// Reads entry `index` of port `port`'s GID table with its type.
    ///
    /// An unused entry is an error with errno `ENODATA`.
    #[doc(alias = "ibv_query_gid_ex")]
    pub fn query_gid_entry(&self, port: u8, index: u32) -> Result<GidEntry> {
        self.check_gid_index("ibv_query_gid_ex", port, index)?;
        let mut raw = sys::ibv_gid_entry::default();
        // SAFETY: live context, valid out-pointer, flags must be 0.
        let rc = unsafe { sys::ibv_query_gid_ex(self.as_ptr(), port.into(), index, &mut raw, 0) };
        check_rc("ibv_query_gid_ex", rc)?;
        Ok(GidEntry::from_raw(&raw))
    }

    /// Every valid GID table entry of every port, with its type.
    #[doc(alias = "ibv_query_gid_table")]
    pub fn gid_table(&self) -> Result<Vec<GidEntry>> {
        let mut max = 0usize;
        for port in self.ports() {
            max += self.query_port(port)?.gid_tbl_len as usize;
        }
        let mut raw = vec![sys::ibv_gid_entry::default(); max];
        // SAFETY: live context; `raw` has room for `max` entries; flags must be 0.
        let n = unsafe { sys::ibv_query_gid_table(self.as_ptr(), raw.as_mut_ptr(), max, 0) };
        let n = check_count("ibv_query_gid_table", n as c_int)?;
        Ok(raw[..n.min(max)].iter().map(GidEntry::from_raw).collect())
    }

    /// Reads entry `index` of port `port`'s P_Key table.
    #[doc(alias = "ibv_query_pkey")]
    pub fn query_pkey(&self, port: u8, index: u16) -> Result<u16> {
        let len = self.query_port(port)?.pkey_tbl_len;
        if index >= len {
            return Err(Error::invalid(
                "ibv_query_pkey",
                format!("P_Key index {index} is outside port {port}'s table of {len} entries"),
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
    /// objects created from it, are alive; it is then closed when the last
    /// of them is dropped. Dropping a `Context` never fails visibly.
    #[doc(alias = "ibv_close_device")]
    pub fn close(self) -> Result<()> {
        close_shared(self.inner)
    }

    /// Whether `other` is a handle to the same open device context.
    pub(crate) fn same_as(&self, other: &Context) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
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
