//! Queue pair types and states.

use crate::sys::{ibv_qp_state, ibv_qp_type};
c_enum! {
    /// The transport service of a queue pair (`enum ibv_qp_type`).
    #[doc(alias = "ibv_qp_type")]
    pub enum QpType(ibv_qp_type): u32 {
        /// Reliable Connected.
        Rc = IBV_QPT_RC,
        /// Unreliable Connected.
        Uc = IBV_QPT_UC,
        /// Unreliable Datagram.
        Ud = IBV_QPT_UD,
        /// Raw Ethernet packets (needs `CAP_NET_RAW` and device support; not on rxe).
        RawPacket = IBV_QPT_RAW_PACKET,
        /// XRC initiator (created through `ibv_create_qp_ex` with an XRC domain).
        XrcSend = IBV_QPT_XRC_SEND,
        /// XRC target.
        XrcRecv = IBV_QPT_XRC_RECV,
        /// A provider-specific type.
        Driver = IBV_QPT_DRIVER,
    }
}

impl QpType {
    /// The short name used in messages: `RC`, `UC`, `UD`, `RAW_PACKET`, ...
    pub fn short_name(self) -> &'static str {
        self.c_name().trim_start_matches("IBV_QPT_")
    }
}

c_enum! {
    /// The state of a queue pair (`enum ibv_qp_state`).
    #[doc(alias = "ibv_qp_state")]
    pub enum QpState(ibv_qp_state): u32 {
        /// Reset: just created, or reset; nothing can be posted.
        Reset = IBV_QPS_RESET,
        /// Initialised: receives can be posted.
        Init = IBV_QPS_INIT,
        /// Ready To Receive.
        Rtr = IBV_QPS_RTR,
        /// Ready To Send.
        Rts = IBV_QPS_RTS,
        /// Send Queue Drained.
        Sqd = IBV_QPS_SQD,
        /// Send Queue Error.
        Sqe = IBV_QPS_SQE,
        /// Error: outstanding work requests are flushed.
        Err = IBV_QPS_ERR,
        /// Not known.
        Unknown = IBV_QPS_UNKNOWN,
    }
}

impl QpState {
    /// The short name used in messages: `RESET`, `INIT`, `RTR`, ...
    pub fn short_name(self) -> &'static str {
        self.c_name().trim_start_matches("IBV_QPS_")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_names() {
        for t in QpType::ALL {
            assert_eq!(QpType::from_raw(t.as_raw()), Some(*t));
        }
        for s in QpState::ALL {
            assert_eq!(QpState::from_raw(s.as_raw()), Some(*s));
        }
        assert_eq!(QpType::Rc.as_raw(), 2);
        assert_eq!(QpType::RawPacket.short_name(), "RAW_PACKET");
        assert_eq!(QpState::Rtr.short_name(), "RTR");
        assert_eq!(QpState::Reset.as_raw(), 0);
        assert_eq!(QpState::from_raw(42), None);
    }
}
