//! The IB connection manager's reject reasons (`enum ib_cm_rej_reason`,
//! IBTA table 112), as `RDMA_CM_EVENT_REJECTED` carries them in its status:
//! their names, and what the common ones mean for a program.

/// The reasons a program meets, with what each means; the rest by name.
const REASONS: &[(i32, &str, &str)] = &[
    (1, "IB_CM_REJ_NO_QP", "the peer had no QP for the request"),
    (3, "IB_CM_REJ_NO_RESOURCES", "the peer is out of resources"),
    (4, "IB_CM_REJ_TIMEOUT", "the peer's CM gave up waiting"),
    (5, "IB_CM_REJ_UNSUPPORTED", "the peer does not support what the request asks"),
    (6, "IB_CM_REJ_INVALID_COMM_ID", ""),
    (7, "IB_CM_REJ_INVALID_COMM_INSTANCE", ""),
    (
        8,
        "IB_CM_REJ_INVALID_SERVICE_ID",
        "nobody is listening on that port (or the listener is on another address)",
    ),
    (9, "IB_CM_REJ_INVALID_TRANSPORT_TYPE", "the peer's listener takes another port space or QP type"),
    (
        10,
        "IB_CM_REJ_STALE_CONN",
        "the peer still holds an older connection of these QP numbers",
    ),
    (11, "IB_CM_REJ_RDC_NOT_EXIST", ""),
    (12, "IB_CM_REJ_INVALID_GID", "the peer does not have the GID the request names"),
    (13, "IB_CM_REJ_INVALID_LID", ""),
    (14, "IB_CM_REJ_INVALID_SL", ""),
    (15, "IB_CM_REJ_INVALID_TRAFFIC_CLASS", ""),
    (16, "IB_CM_REJ_INVALID_HOP_LIMIT", ""),
    (17, "IB_CM_REJ_INVALID_PACKET_RATE", ""),
    (24, "IB_CM_REJ_PORT_CM_REDIRECT", ""),
    (25, "IB_CM_REJ_PORT_REDIRECT", ""),
    (26, "IB_CM_REJ_INVALID_MTU", "the peer's port cannot take the path's MTU"),
    (
        27,
        "IB_CM_REJ_INSUFFICIENT_RESP_RESOURCES",
        "the peer cannot take as many RDMA reads and atomics in flight as asked (ConnParam's initiator depth)",
    ),
    (
        28,
        "IB_CM_REJ_CONSUMER_DEFINED",
        "the peer's program rejected the connection (rdma_reject), or its CM could not move its QP",
    ),
    (29, "IB_CM_REJ_INVALID_RNR_RETRY", ""),
    (30, "IB_CM_REJ_DUPLICATE_LOCAL_COMM_ID", ""),
    (31, "IB_CM_REJ_INVALID_CLASS_VERSION", ""),
    (32, "IB_CM_REJ_INVALID_FLOW_LABEL", ""),
];

/// `REASON: NAME: what it means` (or `REASON: NAME`, or `REASON` alone for
/// a reason this table does not know).
pub(super) fn describe(reason: i32) -> String {
    match REASONS.iter().find(|(r, ..)| *r == reason) {
        Some((_, name, "")) => format!("{reason}: {name}"),
        Some((_, name, meaning)) => format!("{reason}: {name}: {meaning}"),
        None => reason.to_string(),
    }
}

/// The status of a SIDR reply (`enum ib_cm_sidr_status`) that was not a
/// success, as `RDMA_CM_EVENT_UNREACHABLE` carries it for UD ids.
pub(super) fn describe_sidr(status: i32) -> String {
    let named = match status {
        1 => "IB_SIDR_UNSUPPORTED: nobody is listening on that port (UD)",
        2 => "IB_SIDR_REJECT: the peer's program rejected the request",
        3 => "IB_SIDR_NO_QP: the peer had no QP for the request",
        4 => "IB_SIDR_REDIRECT",
        5 => "IB_SIDR_UNSUPPORTED_VERSION",
        _ => return status.to_string(),
    };
    format!("{status}: {named}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_reasons_are_named_and_explained() {
        let d = describe(8);
        assert!(
            d.starts_with("8: IB_CM_REJ_INVALID_SERVICE_ID: nobody is listening"),
            "{d}"
        );
        assert!(describe(28).contains("rdma_reject"));
        assert_eq!(describe(13), "13: IB_CM_REJ_INVALID_LID");
        assert_eq!(describe(99), "99");
        assert!(describe_sidr(1).contains("nobody is listening"));
        assert_eq!(describe_sidr(9), "9");
        let mut codes: Vec<i32> = REASONS.iter().map(|r| r.0).collect();
        codes.dedup();
        assert_eq!(codes.len(), REASONS.len(), "a reason twice");
    }
}
