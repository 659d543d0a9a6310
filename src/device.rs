//! The RDMA devices of the system: listing them and opening a [`Context`].

use crate::sys::{ibv_node_type, ibv_transport_type};
use std::ffi::CStr;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::sys;

/// The list of RDMA devices, as `ibv_get_device_list` returned it.
///
/// Contexts opened from it keep the list alive, so it can be dropped at any time.
///
/// ```no_run
/// let devices = rdma_verbs::DeviceList::new()?;
/// for dev in devices.iter() {
///     println!("{} {}", dev.name(), dev.node_guid());
/// }
/// # Ok::<(), rdma_verbs::Error>(())
/// ```
#[doc(alias = "ibv_get_device_list")]
pub struct DeviceList {
    pub(crate) inner: Arc<ListInner>,
}

/// Owns the array from `ibv_get_device_list`.
pub(crate) struct ListInner {
    /// `None` when the kernel has no RDMA support at all.
    list: Option<NonNull<*mut sys::ibv_device>>,
    len: usize,
}

// The array and the `ibv_device`s it points to are immutable after
// `ibv_get_device_list` returns: libibverbs only reads them.
// SAFETY: by the above, and `ibv_free_device_list` may run on any thread
// (verbs(7): the library is thread safe).
unsafe impl Send for ListInner {}
// SAFETY: as above, shared access only reads.
unsafe impl Sync for ListInner {}

impl Drop for ListInner {
    fn drop(&mut self) {
        if let Some(list) = self.list {
            // SAFETY: `list` came from ibv_get_device_list and is freed once, here,
            // after every `Device` borrow and every `Context` holding this `Arc` is gone.
            unsafe { sys::ibv_free_device_list(list.as_ptr()) };
        }
    }
}

impl DeviceList {
    /// Lists the RDMA devices of the system.
    ///
    /// A system without RDMA support in its kernel (`ENOSYS`) gives an empty
    /// list, not an error.
    #[doc(alias = "ibv_get_device_list")]
    pub fn new() -> Result<Self> {
        let mut n: std::ffi::c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the result is checked for NULL.
        let list = unsafe { sys::ibv_get_device_list(&mut n) };
        let list = match crate::error::check_ptr("ibv_get_device_list", list) {
            Ok(list) => Some(list),
            Err(e) if e.errno() == Some(libc::ENOSYS) => {
                n = 0;
                None
            }
            Err(e) => return Err(e),
        };
        Ok(DeviceList {
            inner: Arc::new(ListInner {
                list,
                len: usize::try_from(n).unwrap_or(0),
            }),
        })
    }

    /// How many devices there are.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Whether there are no devices.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// The device at `index`, if there is one.
    pub fn get(&self, index: usize) -> Option<Device<'_>> {
        let list = self.inner.list?;
        if index >= self.inner.len {
            return None;
        }
        // SAFETY: `index < len`, and the array holds `len` valid pointers.
        let raw = unsafe { *list.as_ptr().add(index) };
        NonNull::new(raw).map(|raw| Device { list: self, raw })
    }

    /// The devices, in the order libibverbs lists them.
    pub fn iter(&self) -> impl Iterator<Item = Device<'_>> + '_ {
        (0..self.len()).filter_map(move |i| self.get(i))
    }

    /// The device called `name` (e.g. `"rxe0"`, `"mlx5_0"`).
    pub fn find(&self, name: &str) -> Result<Device<'_>> {
        self.iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| Error::DeviceNotFound(name.to_owned()))
    }
}

impl fmt::Debug for DeviceList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// One RDMA device (`struct ibv_device`), borrowed from a [`DeviceList`].
#[doc(alias = "ibv_device")]
#[derive(Clone, Copy)]
pub struct Device<'list> {
    list: &'list DeviceList,
    raw: NonNull<sys::ibv_device>,
}

impl<'list> Device<'list> {
    /// The kernel's name of the device, e.g. `"rxe0"` or `"mlx5_0"`.
    #[doc(alias = "ibv_get_device_name")]
    pub fn name(&self) -> &'list str {
        // SAFETY: `raw` is a live device of the list borrowed for 'list; the
        // name is a NUL-terminated array inside it.
        let name = unsafe { sys::ibv_get_device_name(self.raw.as_ptr()) };
        if name.is_null() {
            return "";
        }
        // SAFETY: non-NULL, NUL-terminated, and lives as long as the list.
        unsafe { CStr::from_ptr(name) }.to_str().unwrap_or("")
    }

    /// The device's node GUID.
    #[doc(alias = "ibv_get_device_guid")]
    pub fn node_guid(&self) -> Guid {
        // SAFETY: `raw` is a live device (see `name`).
        Guid::from_be(unsafe { sys::ibv_get_device_guid(self.raw.as_ptr()) })
    }

    /// The kernel's index of the device, when the kernel reports one.
    #[doc(alias = "ibv_get_device_index")]
    pub fn index(&self) -> Option<u32> {
        // SAFETY: `raw` is a live device (see `name`).
        let i = unsafe { sys::ibv_get_device_index(self.raw.as_ptr()) };
        u32::try_from(i).ok()
    }

    /// What kind of node the device is.
    pub fn node_type(&self) -> NodeType {
        // SAFETY: `raw` is a live device (see `name`); plain field read.
        NodeType::from_raw(unsafe { (*self.raw.as_ptr()).node_type }).unwrap_or(NodeType::Unknown)
    }

    /// The transport the device speaks.
    pub fn transport_type(&self) -> TransportType {
        // SAFETY: as for `node_type`.
        TransportType::from_raw(unsafe { (*self.raw.as_ptr()).transport_type })
            .unwrap_or(TransportType::Unknown)
    }

    /// Opens the device.
    #[doc(alias = "ibv_open_device")]
    pub fn open(&self) -> Result<Context> {
        Context::from_device(self.raw, Arc::clone(&self.list.inner))
    }
}

impl fmt::Debug for Device<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name())
            .field("node_guid", &self.node_guid())
            .field("node_type", &self.node_type())
            .field("transport_type", &self.transport_type())
            .finish()
    }
}

/// A 64-bit InfiniBand GUID (node, system image or port GUID), in host order.
///
/// Displays as libibverbs' tools do: `0011:2233:4455:6677`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Guid(pub u64);

impl Guid {
    /// From the big-endian `__be64` libibverbs stores.
    pub fn from_be(raw: u64) -> Self {
        Guid(u64::from_be(raw))
    }
}

impl fmt::Display for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = self.0;
        write!(
            f,
            "{:04x}:{:04x}:{:04x}:{:04x}",
            g >> 48,
            (g >> 32) & 0xffff,
            (g >> 16) & 0xffff,
            g & 0xffff
        )
    }
}

impl fmt::Debug for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Guid({self})")
    }
}

c_enum! {
    /// The kind of node a device is (`enum ibv_node_type`).
    #[doc(alias = "ibv_node_type")]
    pub enum NodeType(ibv_node_type): i32 {
        /// Not known to libibverbs.
        Unknown = IBV_NODE_UNKNOWN,
        /// An InfiniBand channel adapter (also RoCE NICs and rxe).
        Ca = IBV_NODE_CA,
        /// An InfiniBand switch.
        Switch = IBV_NODE_SWITCH,
        /// An InfiniBand router.
        Router = IBV_NODE_ROUTER,
        /// An iWARP NIC.
        Rnic = IBV_NODE_RNIC,
        /// A Cisco usNIC.
        Usnic = IBV_NODE_USNIC,
        /// A Cisco usNIC over UDP.
        UsnicUdp = IBV_NODE_USNIC_UDP,
        /// Unspecified (e.g. EFA).
        Unspecified = IBV_NODE_UNSPECIFIED,
    }
}

c_enum! {
    /// The transport a device speaks (`enum ibv_transport_type`).
    #[doc(alias = "ibv_transport_type")]
    pub enum TransportType(ibv_transport_type): i32 {
        /// Not known to libibverbs.
        Unknown = IBV_TRANSPORT_UNKNOWN,
        /// InfiniBand transport (also RoCE and rxe).
        Ib = IBV_TRANSPORT_IB,
        /// iWARP.
        Iwarp = IBV_TRANSPORT_IWARP,
        /// usNIC.
        Usnic = IBV_TRANSPORT_USNIC,
        /// usNIC over UDP.
        UsnicUdp = IBV_TRANSPORT_USNIC_UDP,
        /// Unspecified.
        Unspecified = IBV_TRANSPORT_UNSPECIFIED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guid_displays_like_ibv_devinfo() {
        let g = Guid::from_be(0x0011_2233_4455_6677u64.to_be());
        assert_eq!(g.to_string(), "0011:2233:4455:6677");
        assert_eq!(g.0, 0x0011_2233_4455_6677);
    }

    #[test]
    fn node_and_transport_types_round_trip() {
        for t in NodeType::ALL {
            assert_eq!(NodeType::from_raw(t.as_raw()), Some(*t));
        }
        for t in TransportType::ALL {
            assert_eq!(TransportType::from_raw(t.as_raw()), Some(*t));
        }
        assert_eq!(NodeType::Ca.as_raw(), 1);
        assert_eq!(NodeType::Ca.c_name(), "IBV_NODE_CA");
        assert_eq!(NodeType::from_raw(99), None);
    }

    #[test]
    fn listing_devices_never_fails_without_rdma() {
        // On a host with no RDMA support this is an empty list; with devices
        // every entry has a name.
        let list = DeviceList::new().expect("ibv_get_device_list");
        for d in list.iter() {
            assert!(!d.name().is_empty());
        }
        assert!(matches!(
            list.find("no-such-device-xyz"),
            Err(Error::DeviceNotFound(_))
        ));
    }
}
