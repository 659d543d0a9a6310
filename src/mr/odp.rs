//! On-demand paging (ODP): what a device reports of it (`struct
//! ibv_odp_caps`) and prefetch advice on a region (`ibv_advise_mr`).
//!
//! A region registered with [`AccessFlags::ON_DEMAND`] has its pages
//! neither pinned nor mapped for the device at registration: the device
//! faults them in when a request first reaches them, and the kernel
//! follows the process's page tables from then on. Registration is cheap
//! and the memory may be larger than what the process may pin
//! (`RLIMIT_MEMLOCK`). The region is otherwise an ordinary region: the
//! same [`Chunk`](crate::Chunk)s, the same ownership (its memory stays
//! the region's until deregistration, so nothing can unmap it under the
//! device), the same requests. A device without
//! [`OdpGeneralCaps::SUPPORT`] refuses it with [`Error::Unsupported`]
//! before any call.
//!
//! # rxe
//!
//! rxe reports ODP from Linux 6.14, and the crate refuses it there with
//! [`Error::Unsupported`] all the same: its copy into and out of ODP pages
//! (`__rxe_odp_mr_copy` in `rxe_odp.c`) computes the offset within the
//! page and then copies at the page's start. Measured on Linux 7.2.13 in
//! the sid VM: RDMA writes at offsets 0, 8 and 100 of a region all landed
//! at offset 0, one at 4104 at 4096, one at 11192 at 8192, and an RDMA
//! read of the written address returned the data from there. A request
//! would write, and a send would read, bytes it does not name: other
//! chunks', or for a region that starts inside a page, bytes before the
//! region (a heap allocator's header). Its atomics compute the offset
//! right, but a region is not registered for atomics alone.
//!
//! [`MemoryRegion::prefetch`] asks the kernel to fault a range in before
//! the first request needs it, and waits until it has;
//! [`MemoryRegion::prefetch_async`] only starts it.
//!
//! Implicit ODP (one region over the whole address space, `ibv_reg_mr`
//! with a NULL address and `SIZE_MAX`) is not offered: its keys reach
//! every byte of the process, which no safe handle can promise anything
//! about. [`OdpGeneralCaps::SUPPORT_IMPLICIT`] says whether a device has it.

use std::ops::Range;

use super::{AccessFlags, ChunkedRegion, MemoryRegion, RegionCore};
use crate::error::{check_rc, Error, Result};
use crate::sys;

bitflags::bitflags! {
    /// Whether a device has on-demand paging (`enum ibv_odp_general_caps`,
    /// `odp_caps.general_caps` of `struct ibv_device_attr_ex`).
    #[doc(alias = "ibv_odp_general_caps")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct OdpGeneralCaps: u64 {
        /// `IBV_ODP_SUPPORT`: regions may be registered with
        /// [`AccessFlags::ON_DEMAND`].
        const SUPPORT = sys::ibv_odp_general_caps::IBV_ODP_SUPPORT.0 as u64;
        /// `IBV_ODP_SUPPORT_IMPLICIT`: implicit ODP (a region over the
        /// whole address space), which the safe API does not offer.
        const SUPPORT_IMPLICIT = sys::ibv_odp_general_caps::IBV_ODP_SUPPORT_IMPLICIT.0 as u64;
        // Bits newer kernels report that this version does not name.
        const _ = !0;
    }
}

bitflags::bitflags! {
    /// What a transport may do with ODP memory (`enum
    /// ibv_odp_transport_cap_bits`: `rc_odp_caps`, `uc_odp_caps`,
    /// `ud_odp_caps` and `xrc_odp_caps`).
    #[doc(alias = "ibv_odp_transport_cap_bits")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct OdpTransportCaps: u32 {
        /// `IBV_ODP_SUPPORT_SEND`: sends from ODP memory.
        const SEND = sys::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_SEND.0;
        /// `IBV_ODP_SUPPORT_RECV`: receives into ODP memory.
        const RECV = sys::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_RECV.0;
        /// `IBV_ODP_SUPPORT_WRITE`: RDMA writes into ODP memory.
        const WRITE = sys::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_WRITE.0;
        /// `IBV_ODP_SUPPORT_READ`: RDMA reads of ODP memory.
        const READ = sys::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_READ.0;
        /// `IBV_ODP_SUPPORT_ATOMIC`: atomics on ODP memory.
        const ATOMIC = sys::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_ATOMIC.0;
        /// `IBV_ODP_SUPPORT_SRQ_RECV`: SRQ receives into ODP memory.
        const SRQ_RECV = sys::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_SRQ_RECV.0;
        /// `IBV_ODP_SUPPORT_FLUSH`: RDMA FLUSH of ODP memory (rdma-core 58).
        const FLUSH = sys::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_FLUSH.0;
        /// `IBV_ODP_SUPPORT_ATOMIC_WRITE`: RDMA ATOMIC_WRITE into ODP memory (rdma-core 58).
        const ATOMIC_WRITE = sys::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_ATOMIC_WRITE.0;
        // Bits newer kernels report that this version does not name.
        const _ = !0;
    }
}

/// A device's on-demand paging capabilities (`struct ibv_odp_caps` and
/// `xrc_odp_caps` of `struct ibv_device_attr_ex`).
///
/// ```no_run
/// use rdma_verbs::{Context, OdpGeneralCaps};
/// let ctx = Context::open_first()?;
/// let odp = ctx.attr().odp;
/// if odp.general.contains(OdpGeneralCaps::SUPPORT) {
///     println!("ODP; RC may {:?}", odp.rc);
/// }
/// # Ok::<(), rdma_verbs::Error>(())
/// ```
#[doc(alias = "ibv_odp_caps")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct OdpCaps {
    /// `general_caps`.
    pub general: OdpGeneralCaps,
    /// `per_transport_caps.rc_odp_caps`.
    pub rc: OdpTransportCaps,
    /// `per_transport_caps.uc_odp_caps`.
    pub uc: OdpTransportCaps,
    /// `per_transport_caps.ud_odp_caps`.
    pub ud: OdpTransportCaps,
    /// `xrc_odp_caps`.
    pub xrc: OdpTransportCaps,
}

impl OdpCaps {
    pub(crate) fn from_raw(ex: &sys::ibv_device_attr_ex) -> Self {
        let t = &ex.odp_caps.per_transport_caps;
        OdpCaps {
            general: OdpGeneralCaps::from_bits_retain(ex.odp_caps.general_caps),
            rc: OdpTransportCaps::from_bits_retain(t.rc_odp_caps),
            uc: OdpTransportCaps::from_bits_retain(t.uc_odp_caps),
            ud: OdpTransportCaps::from_bits_retain(t.ud_odp_caps),
            xrc: OdpTransportCaps::from_bits_retain(ex.xrc_odp_caps),
        }
    }
}

/// What the device is told to prepare (`enum ibv_advise_mr_advice`).
#[doc(alias = "ibv_advise_mr_advice")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MrAdvice {
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH`: fault the pages in for reading.
    Prefetch,
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE`: fault them in for reading and
    /// writing (the region needs [`AccessFlags::LOCAL_WRITE`]).
    PrefetchWrite,
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT`: map for the device only the
    /// pages already present in memory, faulting none in.
    PrefetchNoFault,
}

impl MrAdvice {
    fn raw(self) -> sys::ib_uverbs_advise_mr_advice::Type {
        use sys::ib_uverbs_advise_mr_advice as a;
        match self {
            MrAdvice::Prefetch => a::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH,
            MrAdvice::PrefetchWrite => a::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE,
            MrAdvice::PrefetchNoFault => a::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT,
        }
    }
}

/// `IBV_ADVISE_MR_FLAG_FLUSH` (`IB_UVERBS_ADVISE_MR_FLAG_FLUSH`): the call
/// returns once the pages are mapped, not when the work is queued.
const ADVISE_FLUSH: u32 = 1;

/// The most bytes one `struct ibv_sge` of the advice names (its 32-bit
/// length); a longer range is advised in pieces of this size, in one call.
const SGE_MAX: usize = 1 << 31;

/// Advises `range` of the region of `core` (`ibv_advise_mr`), synchronously
/// when `sync`.
fn advise(core: &RegionCore, advice: MrAdvice, range: Range<usize>, sync: bool) -> Result<()> {
    const VERB: &str = "ibv_advise_mr";
    check_advice(core, advice, &range)?;
    // Local entries name the region's bytes by its iova, as requests do.
    let base = core.addr();
    let lkey = core.raw().lkey;
    let sges: Vec<sys::ibv_sge> = range
        .clone()
        .step_by(SGE_MAX)
        .map(|start| sys::ibv_sge {
            addr: base + start as u64,
            length: (range.end - start).min(SGE_MAX) as u32,
            lkey,
        })
        .collect();
    let pd = core.pd();
    // A live PD and one of its live regions (held by `core`); the entries
    // name bytes inside that region (checked), and the kernel only reads the
    // array during the call; advice maps pages, it never writes the memory.
    // SAFETY: see above.
    let rc = unsafe {
        sys::ibv_advise_mr(
            pd.as_ptr(),
            advice.raw(),
            if sync { ADVISE_FLUSH } else { 0 },
            sges.as_ptr().cast_mut(),
            sges.len() as u32,
        )
    };
    check_rc(VERB, rc).map(|_| ()).map_err(|e| match e.errno() {
        Some(errno @ (libc::EOPNOTSUPP | libc::ENOSYS)) => Error::Unsupported {
            what: "prefetch advice (ibv_advise_mr)",
            device: pd.context().name().to_owned(),
            errno: Some(errno),
        },
        _ => e,
    })
}

/// What `ibv_advise_mr` would refuse or misread, refused before the call.
fn check_advice(core: &RegionCore, advice: MrAdvice, range: &Range<usize>) -> Result<()> {
    const VERB: &str = "ibv_advise_mr";
    let refuse = |why: String| Err(Error::invalid(VERB, why));
    if range.start >= range.end || range.end > core.len() {
        return refuse(format!(
            "the range {range:?} is empty or not inside the region of {} bytes",
            core.len()
        ));
    }
    if !core.access().contains(AccessFlags::ON_DEMAND) {
        return refuse(format!(
            "prefetch advice is for on-demand regions, and this one was registered with {:?}",
            core.access()
        ));
    }
    if advice == MrAdvice::PrefetchWrite && !core.access().contains(AccessFlags::LOCAL_WRITE) {
        return refuse("PrefetchWrite needs a region with AccessFlags::LOCAL_WRITE".into());
    }
    Ok(())
}

macro_rules! prefetch_methods {
    ($ty:ident) => {
        impl<B> $ty<B> {
            /// Faults `range` (byte offsets into the region) in for the
            /// device and returns once it is mapped (`ibv_advise_mr` with
            /// `IBV_ADVISE_MR_FLAG_FLUSH`), so that the first request to
            /// reach it does not wait for page faults.
            ///
            /// Refused before the call: an empty range or one not wholly
            /// inside the region, a region registered without
            /// [`AccessFlags::ON_DEMAND`], and [`MrAdvice::PrefetchWrite`]
            /// on a region without [`AccessFlags::LOCAL_WRITE`].
            ///
            /// # Errors
            /// [`Error::InvalidArgument`] for what is refused above,
            /// [`Error::Unsupported`] when the provider or kernel has no
            /// advice (`EOPNOTSUPP`), and [`Error::Verb`] when the kernel
            /// fails it (`EFAULT` for memory it cannot fault in).
            #[doc(alias = "ibv_advise_mr")]
            #[doc(alias = "IBV_ADVISE_MR_FLAG_FLUSH")]
            pub fn prefetch(&self, advice: MrAdvice, range: Range<usize>) -> Result<()> {
                advise(self.core(), advice, range, true)
            }

            /// Starts faulting `range` in for the device and returns at once
            /// (`ibv_advise_mr` without flags): a hint, whose failure later
            /// is not reported. Refused as [`prefetch`](Self::prefetch) is.
            ///
            /// # Errors
            /// As for [`prefetch`](Self::prefetch).
            #[doc(alias = "ibv_advise_mr")]
            pub fn prefetch_async(&self, advice: MrAdvice, range: Range<usize>) -> Result<()> {
                advise(self.core(), advice, range, false)
            }
        }
    };
}

prefetch_methods!(MemoryRegion);
prefetch_methods!(ChunkedRegion);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_match_c() {
        assert_eq!(OdpGeneralCaps::SUPPORT.bits(), 1);
        assert_eq!(OdpGeneralCaps::SUPPORT_IMPLICIT.bits(), 2);
        assert_eq!(OdpTransportCaps::SRQ_RECV.bits(), 1 << 5);
        assert_eq!(OdpTransportCaps::ATOMIC_WRITE.bits(), 1 << 7);
    }

    #[test]
    fn caps_are_read_from_the_extended_attributes() {
        let mut ex = sys::ibv_device_attr_ex::default();
        ex.odp_caps.general_caps = 1;
        ex.odp_caps.per_transport_caps.rc_odp_caps = 0x1f;
        ex.xrc_odp_caps = 2;
        let c = OdpCaps::from_raw(&ex);
        assert_eq!(c.general, OdpGeneralCaps::SUPPORT);
        assert!(c
            .rc
            .contains(OdpTransportCaps::ATOMIC | OdpTransportCaps::SEND));
        assert_eq!(c.ud, OdpTransportCaps::empty());
        assert_eq!(c.xrc, OdpTransportCaps::RECV);
    }
}
