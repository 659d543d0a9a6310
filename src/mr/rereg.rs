//! `ibv_rereg_mr`: changing a registered region's access rights,
//! protection domain or buffer in place, keeping its keys where the device
//! can.

use std::ffi::c_int;
use std::ptr::NonNull;
use std::sync::Arc;

use super::owned::check_registration;
use super::{
    check_access, check_device_access, AccessFlags, Memory, MemoryRegion, MrInner, RegisterBuffer,
};
use crate::error::{last_errno, Error, InUseOp, Refused, Result};
use crate::handle::region_in_use;
use crate::pd::ProtectionDomain;
use crate::sys;
use crate::users::{Tally, UserKind};

const VERB: &str = "ibv_rereg_mr";

/// How a failed `ibv_rereg_mr` left the region.
enum Failure {
    /// The provider or the kernel does not do it: nothing was changed.
    Unsupported(i32),
    /// Anything else: the region may or may not have been changed.
    Unknown(i32),
}

impl<B> MemoryRegion<B> {
    /// Changes the region's access rights in place (`ibv_rereg_mr` with
    /// `IBV_REREG_MR_CHANGE_ACCESS`): same memory, and on devices that can,
    /// the same lkey and rkey ([`lkey`](Self::lkey) and [`rkey`](Self::rkey)
    /// tell afterwards).
    ///
    /// Refused before any call with [`Error::InUse`] while anything else
    /// names the region (a memory window bound to it: its requests were
    /// checked against the old rights), and for `REMOTE_WRITE` or
    /// `REMOTE_ATOMIC` without `LOCAL_WRITE`. [`Error::Unsupported`] where
    /// the device does not re-register (rxe), with nothing changed.
    ///
    /// When the device fails otherwise, the crate cannot know which rights
    /// the region has: [`access`](Self::access) is then both sets together,
    /// so every check that guards against peers' writes stays on the safe
    /// side (a region that may have `REMOTE_WRITE` is never split into
    /// slices).
    ///
    /// ```no_run
    /// use rdma_verbs::{AccessFlags, Context};
    /// let pd = Context::open_first()?.alloc_pd()?;
    /// let mut mr = pd.register(4096, AccessFlags::LOCAL_WRITE)?;
    /// match mr.rereg_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ) {
    ///     Ok(()) => println!("peers may read it now, rkey {:#x}", mr.rkey()),
    ///     Err(rdma_verbs::Error::Unsupported { .. }) => println!("register a new region instead"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), rdma_verbs::Error>(())
    /// ```
    #[doc(alias = "ibv_rereg_mr")]
    #[doc(alias = "IBV_REREG_MR_CHANGE_ACCESS")]
    pub fn rereg_access(&mut self, access: AccessFlags) -> Result<()> {
        check_access(VERB, access)?;
        check_device_access(self.pd(), access)?;
        let owned = self.only_handle()?;
        // SAFETY: the MR is live and no other handle, chunk or window
        // names it (`only_handle`), so nothing reads its fields meanwhile;
        // with CHANGE_ACCESS alone libibverbs reads neither pd nor addr.
        let rc = unsafe {
            sys::ibv_rereg_mr(
                owned.as_ptr(),
                sys::ibv_rereg_mr_flags::IBV_REREG_MR_CHANGE_ACCESS.0 as c_int,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
                access.bits() as c_int,
            )
        };
        match failure(rc) {
            None => {
                self.core.access = access;
                Ok(())
            }
            Some(Failure::Unsupported(errno)) => Err(self.unsupported(errno)),
            Some(Failure::Unknown(errno)) => {
                self.core.access |= access;
                Err(Error::Verb { verb: VERB, errno })
            }
        }
    }

    /// Moves the region to another protection domain of the same context
    /// in place (`ibv_rereg_mr` with `IBV_REREG_MR_CHANGE_PD`).
    ///
    /// Refused before any call like [`rereg_access`](Self::rereg_access),
    /// and for a PD of another device context. On success the region keeps
    /// `pd` alive instead of its old PD. When the device fails other than
    /// by not supporting it, the region may be in either PD: it keeps both
    /// alive, and counts as a user of both, until it is gone.
    #[doc(alias = "ibv_rereg_mr")]
    #[doc(alias = "IBV_REREG_MR_CHANGE_PD")]
    pub fn rereg_pd(&mut self, pd: &ProtectionDomain) -> Result<()> {
        if pd.context().as_ptr() != self.pd().context().as_ptr() {
            return Err(Error::invalid(
                VERB,
                "the protection domain is of another device context",
            ));
        }
        let owned = self.only_handle()?;
        // SAFETY: the MR and `pd` are live; no other handle names the MR
        // (`only_handle`); with CHANGE_PD alone libibverbs reads no addr.
        let rc = unsafe {
            sys::ibv_rereg_mr(
                owned.as_ptr(),
                sys::ibv_rereg_mr_flags::IBV_REREG_MR_CHANGE_PD.0 as c_int,
                pd.as_ptr(),
                std::ptr::null_mut(),
                0,
                0,
            )
        };
        let tally = || Tally::new(pd.users(), UserKind::MemoryRegion, 1);
        match failure(rc) {
            None => {
                let keep = owned.keep_mut();
                keep.pd = pd.clone();
                keep.tally = tally();
                Ok(())
            }
            Some(Failure::Unsupported(errno)) => Err(self.unsupported(errno)),
            Some(Failure::Unknown(errno)) => {
                owned.keep_mut().maybe_in.push((pd.clone(), tally()));
                Err(Error::Verb { verb: VERB, errno })
            }
        }
    }

    /// The region's owner, if this handle is the only thing that names it.
    fn only_handle(&mut self) -> Result<&mut MrInner> {
        if Arc::get_mut(&mut self.core.inner).is_none() {
            return Err(region_in_use(InUseOp::Rereg, &self.core.inner));
        }
        Arc::get_mut(&mut self.core.inner)
            .ok_or_else(|| Error::invalid(VERB, "the region is in use"))
    }

    #[cold]
    fn unsupported(&self, errno: i32) -> Error {
        Error::Unsupported {
            what: "re-registering a memory region (ibv_rereg_mr)",
            device: self.pd().context().name().to_owned(),
            errno: Some(errno),
        }
    }
}

impl<B: RegisterBuffer> MemoryRegion<B> {
    /// Moves the region onto another buffer in place (`ibv_rereg_mr` with
    /// `IBV_REREG_MR_CHANGE_TRANSLATION`): on devices that can, the same
    /// lkey and rkey now name `buffer`'s bytes, and the old buffer comes
    /// back, the device done with it. The region's iova becomes the new
    /// buffer's address (libibverbs passes it as the new iova).
    ///
    /// Refused before any call, both handed back unchanged: while anything
    /// else names the region ([`Error::InUse`]), for an empty buffer or one
    /// above `max_mr_size`; [`Error::Unsupported`] where the device does not
    /// re-register (rxe), nothing changed. When the device fails otherwise,
    /// the region may map either buffer: it keeps both until it is gone,
    /// hands back only itself (still over the old buffer as far as the
    /// program's reads and writes go), and the new buffer is dropped after
    /// deregistration.
    #[doc(alias = "ibv_rereg_mr")]
    #[doc(alias = "IBV_REREG_MR_CHANGE_TRANSLATION")]
    #[allow(clippy::type_complexity)]
    pub fn rereg_buffer<C: RegisterBuffer>(
        mut self,
        buffer: C,
    ) -> Result<(MemoryRegion<C>, B), Refused<(Self, Option<C>)>> {
        let mut boxed = Box::new(buffer);
        let bytes = boxed.bytes_to_register();
        let (ptr, len) = (NonNull::from(&mut *bytes).cast::<u8>(), bytes.len());
        let checked = check_registration(self.pd(), len, self.access())
            .and_then(|()| self.only_handle().map(|_| ()));
        if let Err(e) = checked {
            return Err(Refused::new(e, (self, Some(*boxed))));
        }
        let raw = self.core.as_ptr();
        // The MR is live and no other handle, chunk or window names it
        // (checked above); `ptr..ptr + len` are bytes the boxed buffer owns
        // and keeps in place (`RegisterBuffer`), kept by the region from
        // here on whatever the outcome (below).
        // SAFETY: a live, unshared MR and bytes kept valid (above).
        let rc = unsafe {
            sys::ibv_rereg_mr(
                raw,
                sys::ibv_rereg_mr_flags::IBV_REREG_MR_CHANGE_TRANSLATION.0 as c_int,
                std::ptr::null_mut(),
                ptr.as_ptr().cast(),
                len,
                0,
            )
        };
        let failed = failure(rc);
        if let Some(Failure::Unsupported(errno)) = failed {
            let e = self.unsupported(errno);
            return Err(Refused::new(e, (self, Some(*boxed))));
        }
        let memory = Memory::new(ptr, len, ptr.as_ptr() as u64, boxed);
        let Some(owned) = Arc::get_mut(&mut self.core.inner) else {
            // Cannot happen: checked above, and `self` was held since.
            // Keep the new buffer with the region, as for an unknown failure.
            return Err(Refused::new(
                Error::invalid(VERB, "the region is in use"),
                (self, None),
            ));
        };
        let keep = owned.keep_mut();
        match failed {
            None => {
                let old = std::mem::replace(&mut keep.memory, memory);
                // SAFETY: a `MemoryRegion<B>`'s memory owner is a `Box<B>`.
                let old = unsafe { old.into_owner::<B>() };
                Ok((MemoryRegion::from_core(self.core), old))
            }
            Some(Failure::Unknown(errno)) | Some(Failure::Unsupported(errno)) => {
                keep.maybe_mapped.push(memory);
                Err(Refused::new(
                    Error::Verb { verb: VERB, errno },
                    (self, None),
                ))
            }
        }
    }
}

/// Reads `ibv_rereg_mr`'s result: 0, or a negative
/// `IBV_REREG_MR_ERR_*` code with `errno` set.
fn failure(rc: c_int) -> Option<Failure> {
    if rc == 0 {
        return None;
    }
    let errno = if rc > 0 { rc } else { last_errno(libc::EINVAL) };
    // EOPNOTSUPP comes from libibverbs' stand-in for a provider without
    // rereg (before any call) and from kernels that refuse the change
    // up front; ENOSYS and EPROTONOSUPPORT from kernels without the command.
    Some(match errno {
        libc::EOPNOTSUPP | libc::ENOSYS | libc::EPROTONOSUPPORT => Failure::Unsupported(errno),
        _ => Failure::Unknown(errno),
    })
}
