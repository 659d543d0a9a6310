//! The device contexts librdmacm opens, as crate [`Context`]s.
//!
//! librdmacm opens each device once per process (`cma_dev->verbs`) and gives
//! that context to every id on the device; `rdma_create_qp` takes only a PD
//! of that very context. It closes a context only when the device is
//! removed *and* nothing holds it: a hold is taken with `rdma_get_devices`
//! and let go with `rdma_free_devices` (`cma_dev->refcnt`). A crate
//! [`Context`] for such a context holds such a list, and is shared: one per
//! raw context, so that [`Context::same_as`]-based checks (a CQ of the PD's
//! context) hold across ids.

use std::ptr::NonNull;
use std::sync::{Mutex, Weak};

use crate::context::{Context, ContextInner};
use crate::error::{Error, Result};
use crate::sys;

/// librdmacm's hold on its open devices (`rdma_get_devices`).
struct CmDevices {
    list: NonNull<*mut sys::ibv_context>,
}

// SAFETY: the list is a malloc'd array that is only freed (by
// `rdma_free_devices`, which takes librdmacm's global mutex) and never
// read through `&self`.
unsafe impl Send for CmDevices {}
// SAFETY: as above: `&CmDevices` gives access to nothing.
unsafe impl Sync for CmDevices {}

impl CmDevices {
    fn get() -> Result<Self> {
        let mut n = 0;
        // SAFETY: `n` is a valid out-parameter; returns a NULL-terminated
        // array or NULL.
        let list = unsafe { sys::rdma_get_devices(&mut n) };
        NonNull::new(list)
            .map(|list| CmDevices { list })
            .ok_or(Error::Verb {
                verb: "rdma_get_devices",
                errno: std::io::Error::last_os_error()
                    .raw_os_error()
                    .filter(|&e| e != 0)
                    .unwrap_or(libc::ENODEV),
            })
    }

    fn contains(&self, verbs: *mut sys::ibv_context) -> bool {
        let mut p = self.list.as_ptr();
        // SAFETY: a NULL-terminated array from `rdma_get_devices`, alive
        // until `drop`; the walk stops at the NULL.
        unsafe {
            while !(*p).is_null() {
                if *p == verbs {
                    return true;
                }
                p = p.add(1);
            }
        }
        false
    }
}

impl Drop for CmDevices {
    fn drop(&mut self) {
        // SAFETY: the list came from `rdma_get_devices` and is freed once.
        unsafe { sys::rdma_free_devices(self.list.as_ptr()) };
    }
}

/// The crate contexts made so far, by raw context.
static CONTEXTS: Mutex<Vec<Weak<ContextInner>>> = Mutex::new(Vec::new());

/// The [`Context`] for `verbs`, a context librdmacm opened.
pub(crate) fn context_for(verbs: NonNull<sys::ibv_context>) -> Result<Context> {
    let mut known = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
    known.retain(|w| w.strong_count() > 0);
    if let Some(inner) = known
        .iter()
        .filter_map(Weak::upgrade)
        .find(|c| c.as_ptr() == verbs.as_ptr())
    {
        return Ok(Context { inner });
    }
    let hold = CmDevices::get()?;
    if !hold.contains(verbs.as_ptr()) {
        return Err(Error::invalid(
            "rdma_get_devices",
            "librdmacm does not list the id's device context (was the device removed?)",
        ));
    }
    // SAFETY: `verbs` is in librdmacm's list, and `hold` keeps it open
    // (librdmacm closes a context only when nothing holds its device).
    let ctx = unsafe { Context::from_borrowed(verbs, Box::new(hold)) }?;
    known.push(std::sync::Arc::downgrade(&ctx.inner));
    Ok(ctx)
}
