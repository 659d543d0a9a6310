//! The causes each status's facts make likely, most likely first.

use super::{gid_type_name, request_name, status_text, Cause, CauseKind, ExplainFacts};
use crate::cq::WcStatus;
use crate::port::PortState;
use crate::qp::query::QpAttributes;
use crate::qp::{QpType, RequestKind};

/// The likely causes of a completion of `status` on the QP of `f`.
#[cold]
pub(super) fn of(status: Result<WcStatus, u32>, f: &ExplainFacts) -> Vec<Cause> {
    let mut out = Vec::new();
    let c = &mut out;
    match status {
        Ok(WcStatus::Success) => push(
            c,
            CauseKind::NotFailed,
            "the completion succeeded: nothing to explain".to_owned(),
        ),
        Ok(WcStatus::RetryExcErr) => retry_exceeded(c, f),
        Ok(WcStatus::RnrRetryExcErr) => rnr_exceeded(c, f),
        Ok(WcStatus::RemAccessErr) => remote_access(c, f),
        Ok(WcStatus::LocLenErr) => local_length(c, f),
        Ok(WcStatus::RemInvReqErr) => remote_invalid(c, f),
        Ok(WcStatus::LocProtErr | WcStatus::LocAccessErr) => local_buffer(c, f),
        Ok(WcStatus::LocQpOpErr) => {
            if matches!(f.request, Some(RequestKind::Recv | RequestKind::SrqRecv)) {
                // rxe (measured on Linux 6.1) ends a receive shorter than
                // the message so, where the verbs say LOC_LEN_ERR.
                receive_too_short(c, f, " (rxe reports that as IBV_WC_LOC_QP_OP_ERR)");
            }
            qp_operation(c, f)
        }
        Ok(WcStatus::WrFlushErr) => flushed(c, f),
        Ok(WcStatus::RemOpErr) => {
            // rxe (measured on Linux 6.1) answers a send longer than the
            // receive so, where the verbs say REM_INV_REQ_ERR.
            peer_receive_too_short(
                c,
                f,
                "IBV_WC_LOC_QP_OP_ERR on rxe, which answers this send with IBV_WC_REM_OP_ERR",
            );
            rem_op(c, f)
        }
        Ok(WcStatus::BadRespErr | WcStatus::RemAbortErr | WcStatus::RespTimeoutErr) => push(
            c,
            CauseKind::PeerResponse,
            format!(
                "{} answered out of turn or not at all: a peer QP of another type (RC against \
                 UC), a peer reset and reconnected meanwhile, or PSNs that do not match (this \
                 QP's sq_psn {} against the peer's rq_psn)",
                peer(f),
                f.attrs
                    .as_ref()
                    .map_or("?".to_owned(), |a| a.sq_psn.to_string())
            ),
        ),
        Ok(WcStatus::MwBindErr) => push(
            c,
            CauseKind::WindowBind,
            "the memory-window bind was refused: the region lacks IBV_ACCESS_MW_BIND, the \
             window belongs to another PD, or the range runs outside the region"
                .to_owned(),
        ),
        other => push(
            c,
            CauseKind::Device,
            format!(
                "the device reports {} and the crate knows no cause to narrow it down to \
                 (vendor_err {:#x})",
                status_text(other),
                f.vendor_err
            ),
        ),
    }
    out
}

fn push(out: &mut Vec<Cause>, kind: CauseKind, text: String) {
    out.push(Cause::new(kind, text));
}

/// The peer as the QP's path names it: `peer QP 0x12 at GID ...`.
fn peer(f: &ExplainFacts) -> String {
    let Some(a) = &f.attrs else {
        return "the peer QP".to_owned();
    };
    match a.av.grh() {
        Some(g) => format!("peer QP {:#x} at GID {}", a.dest_qp_num, g.dgid()),
        None => format!("peer QP {:#x} at LID {}", a.dest_qp_num, a.av.dest_lid()),
    }
}

/// `IBV_WC_REM_OP_ERR`'s general cause.
fn rem_op(c: &mut Vec<Cause>, f: &ExplainFacts) {
    push(
        c,
        CauseKind::PeerResponse,
        format!(
            "{} could not carry out the operation: its receive's buffers failed its own \
             checks (the peer's receive completes with IBV_WC_LOC_PROT_ERR or \
             IBV_WC_LOC_LEN_ERR), or its QP went to ERR",
            peer(f)
        ),
    );
}

/// `IBV_WC_RETRY_EXC_ERR`: nothing answered within timeout x retries.
fn retry_exceeded(c: &mut Vec<Cause>, f: &ExplainFacts) {
    if let (Some(p), Some(port)) = (&f.port_attr, f.port) {
        if !matches!(p.state, PortState::Active | PortState::ActiveDefer) {
            push(
                c,
                CauseKind::PortNotActive,
                format!(
                    "port {port} is {}, not ACTIVE: nothing leaves or arrives",
                    p.state.c_name().trim_start_matches("IBV_PORT_")
                ),
            );
        }
    }
    let Some(a) = &f.attrs else {
        push(
            c,
            CauseKind::PeerQp,
            "no peer QP answered (the QP's path could not be read): a wrong or destroyed peer \
             QP, or a peer QP not in RTR or RTS"
                .to_owned(),
        );
        return;
    };
    no_route(c, a, f);
    push(
        c,
        CauseKind::PeerQp,
        format!(
            "no QP answered as {}: a wrong peer QP number, a peer QP destroyed, not yet in \
             RTR, or in ERR (check {:#x} against the number the peer sent)",
            peer(f),
            a.dest_qp_num
        ),
    );
    gid_path(c, a, f);
    path_mtu(c, f);
    if let Some(t) = a.timeout.duration() {
        let tries = u32::from(a.retry_cnt.get()) + 1;
        push(
            c,
            CauseKind::AckTimeout,
            format!(
                "ACK timeout {} ({:.1} ms) and retry_cnt {}: the QP gave up after {tries} \
                 tries, about {:.0} ms; a peer or link slower than that ends here too",
                a.timeout.get(),
                t.as_secs_f64() * 1e3,
                a.retry_cnt.get(),
                t.as_secs_f64() * 1e3 * f64::from(tries)
            ),
        );
    }
}

/// The path's own faults: no GRH where the port needs one, or DLID 0 on
/// InfiniBand (which routes by LID, with or without a GRH).
fn no_route(c: &mut Vec<Cause>, a: &QpAttributes, f: &ExplainFacts) {
    let Some(p) = &f.port_attr else { return };
    if a.av.grh().is_none() && p.grh_required() {
        let on = if p.is_roce() {
            "a RoCE port, which addresses peers by GID"
        } else {
            "a port flagged IBV_QPF_GRH_REQUIRED"
        };
        push(
            c,
            CauseKind::NoGrhOnRoce,
            format!(
                "the path has no GRH (is_global 0) on {on}: give it a GlobalRoute \
                 (ConnectOptions::gid_index)"
            ),
        );
    }
    if !p.is_roce() && a.av.dest_lid() == 0 {
        let grh = if a.av.grh().is_some() {
            "a GRH does not replace it"
        } else {
            "and the path has no GRH"
        };
        push(
            c,
            CauseKind::Lid0OnInfiniBand,
            format!(
                "the path's DLID is 0 on an InfiniBand port, which routes by LID ({grh}): \
                 LID 0 reaches no port; the peer's port had no LID when it sent its \
                 endpoint (is a subnet manager running?)"
            ),
        );
    }
}

/// The GRH's two GIDs, when the path has one.
fn gid_path(c: &mut Vec<Cause>, a: &QpAttributes, f: &ExplainFacts) {
    if let Some(g) = a.av.grh() {
        let source = f.sgid.as_ref().map_or(String::new(), |s| {
            format!(" ({} {})", gid_type_name(s.gid_type), s.gid)
        });
        push(
            c,
            CauseKind::GidPath,
            format!(
                "the GRH goes to GID {} from local GID index {}{source}: a destination that is \
                 not the peer port's GID, or a source GID of another type than the peer's \
                 (RoCE v1 against v2, IPv4 against IPv6), never arrives",
                g.dgid(),
                g.sgid_index()
            ),
        );
    }
}

/// The path MTU above the port's active MTU, if it is.
fn path_mtu(c: &mut Vec<Cause>, f: &ExplainFacts) {
    let (Some(a), Some(p)) = (&f.attrs, &f.port_attr) else {
        return;
    };
    if let Some(m) = a.path_mtu.filter(|m| m.bytes() > p.active_mtu.bytes()) {
        push(
            c,
            CauseKind::PathMtuAboveActive,
            format!(
                "the path MTU {} is above port {}'s active MTU {}: packets longer than the \
                 link carries are dropped",
                m.bytes(),
                a.port_num,
                p.active_mtu.bytes()
            ),
        );
    }
}

/// `IBV_WC_RNR_RETRY_EXC_ERR`: the peer had no receive posted.
fn rnr_exceeded(c: &mut Vec<Cause>, f: &ExplainFacts) {
    let retry = f
        .attrs
        .as_ref()
        .map_or(String::new(), |a| match a.rnr_retry.get() {
            0 => "; rnr_retry is 0: the first RNR NAK ended the request".to_owned(),
            n => format!(
                "; rnr_retry {n}: it retried {n} times, each after the peer's min_rnr_timer"
            ),
        });
    push(
        c,
        CauseKind::NoReceiveAtPeer,
        format!(
            "{} had no receive posted when the message arrived (a SEND or an RDMA WRITE with \
             immediate consumes one){retry}: post the peer's receives before the sends that \
             need them, or raise rnr_retry (7: forever)",
            peer(f)
        ),
    );
}

/// `IBV_WC_REM_ACCESS_ERR`: the peer refused the rkey, right or range.
fn remote_access(c: &mut Vec<Cause>, f: &ExplainFacts) {
    push(
        c,
        CauseKind::RemoteRights,
        format!(
            "the region the rkey names at {} lacks the right the operation needs \
             (IBV_ACCESS_REMOTE_WRITE for an RDMA WRITE, REMOTE_READ for a READ, \
             REMOTE_ATOMIC for an atomic), or the peer QP's access flags lack it",
            peer(f)
        ),
    );
    push(
        c,
        CauseKind::RemoteRange,
        "the remote address and length run outside the region (or window) the rkey names: \
         the crate keeps no remote address per request, so check the RemoteAddr's addr plus \
         the request's length against the peer region's addr and length"
            .to_owned(),
    );
    push(
        c,
        CauseKind::StaleRkey,
        "the rkey is stale: the peer deregistered the region, or invalidated or rebound the \
         memory window, after it sent the rkey"
            .to_owned(),
    );
}

/// `IBV_WC_LOC_LEN_ERR`: a receive too short, or a send too long.
fn local_length(c: &mut Vec<Cause>, f: &ExplainFacts) {
    if matches!(f.request, Some(RequestKind::Send)) {
        let limit = match (f.qp_type, &f.port_attr) {
            (QpType::Ud, Some(p)) => {
                format!(
                    "a UD message above the port's active MTU {}",
                    p.active_mtu.bytes()
                )
            }
            (_, Some(p)) => format!("a message above the port's max_msg_sz {}", p.max_msg_sz),
            _ => "a message above what the path allows".to_owned(),
        };
        push(
            c,
            CauseKind::MessageTooLong,
            format!("the send is longer than the QP can carry: {limit}"),
        );
        return;
    }
    receive_too_short(c, f, "");
}

/// The message was longer than the receive's buffers (`how`: how the
/// device reported it, if not as the verbs say).
fn receive_too_short(c: &mut Vec<Cause>, f: &ExplainFacts, how: &str) {
    let len = f
        .recv_bytes
        .map_or(String::new(), |n| format!(" ({n} bytes)"));
    let grh = if f.qp_type == QpType::Ud {
        ", plus the 40 bytes of GRH a UD receive gets first"
    } else {
        ""
    };
    push(
        c,
        CauseKind::ReceiveTooShort,
        format!(
            "the message that arrived was longer than this {}'s buffers{len}{how}: post \
             receives at least as long as the peer's longest send{grh}",
            request_name(f.request)
        ),
    );
}

/// `IBV_WC_REM_INV_REQ_ERR`: the peer refused the request as invalid.
fn remote_invalid(c: &mut Vec<Cause>, f: &ExplainFacts) {
    peer_receive_too_short(c, f, "IBV_WC_LOC_LEN_ERR");
    push(
        c,
        CauseKind::PeerRefusedOp,
        "the peer QP does not take this operation: RDMA or atomic access not enabled on it \
         (ConnectOptions::access), an atomic's address not 8-aligned, or a length above the \
         peer port's max_msg_sz"
            .to_owned(),
    );
}

/// The peer's receive was shorter than this send; `peer_status`: what
/// the peer's receive completes with.
fn peer_receive_too_short(c: &mut Vec<Cause>, f: &ExplainFacts, peer_status: &str) {
    push(
        c,
        CauseKind::PeerReceiveTooShort,
        format!(
            "the receive {} took this send into was shorter than the send (the peer's receive \
             completes with {peer_status})",
            peer(f)
        ),
    );
}

/// `IBV_WC_LOC_PROT_ERR`, `IBV_WC_LOC_ACCESS_ERR`: a local buffer.
fn local_buffer(c: &mut Vec<Cause>, f: &ExplainFacts) {
    let right = if matches!(f.request, Some(RequestKind::Recv | RequestKind::SrqRecv)) {
        "IBV_ACCESS_LOCAL_WRITE, which a receive needs"
    } else {
        "IBV_ACCESS_LOCAL_WRITE, which an RDMA READ's or an atomic's result needs"
    };
    push(
        c,
        CauseKind::LocalBuffer,
        format!(
            "a buffer of this {} is outside its region, in a region of another PD, or its \
             region lacks {right}, or the region (or window) is gone: the safe path checks PD, \
             bounds and rights when posting, so look at raw posts, memory windows and regions \
             a peer invalidated",
            request_name(f.request)
        ),
    );
}

/// `IBV_WC_LOC_QP_OP_ERR`: the request does not fit the QP.
fn qp_operation(c: &mut Vec<Cause>, f: &ExplainFacts) {
    let recv = matches!(f.request, Some(RequestKind::Recv | RequestKind::SrqRecv));
    let caps = f.attrs.as_ref().map_or(String::new(), |a| match recv {
        true => format!(" (max_recv_sge {})", a.cap.max_recv_sge),
        false => format!(
            " (max_send_sge {}, max_inline_data {})",
            a.cap.max_send_sge, a.cap.max_inline_data
        ),
    });
    let what = if recv {
        "more scatter entries than it was created with"
    } else {
        "more gather entries or inline bytes than it was created with, a UD message above the \
         path MTU, an opcode its type does not do, or an address vector the device cannot \
         resolve"
    };
    push(
        c,
        CauseKind::RequestInvalidForQp,
        format!(
            "the {} does not fit this {} QP{caps}: {what}",
            request_name(f.request),
            f.qp_type.short_name()
        ),
    );
}

/// `IBV_WC_WR_FLUSH_ERR`: the QP was in ERR.
fn flushed(c: &mut Vec<Cause>, f: &ExplainFacts) {
    let text = match f.first_failure {
        Some((status, kind)) => format!(
            "the QP was in ERR when this request was processed; its first failure since \
             RESET was {} on a {}: explain that completion, it is the cause",
            status_text(status),
            request_name(Some(kind))
        ),
        None => "the QP was in ERR when this request was processed: an earlier completion \
                 failed (none reclaimed on this QP yet: the cause is the first of its \
                 completions that is not IBV_WC_WR_FLUSH_ERR), a fatal asynchronous event \
                 moved it, or the program moved it to ERR"
            .to_owned(),
    };
    push(c, CauseKind::EarlierFailure, text);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gid::{Gid, GidEntry, GidType};
    use crate::mr::AccessFlags;
    use crate::port::{LinkLayer, Mtu, PortAttr};
    use crate::qp::query::QpAttributes;
    use crate::qp::values::{
        AckTimeout, AddressVector, GlobalRoute, MinRnrTimer, Psn, QKey, QpNum, RateLimit,
        RetryCount, RnrRetry,
    };
    use crate::qp::{Explanation, QpCaps, QpState};
    use crate::sys;

    fn attrs(av: AddressVector, path_mtu: Mtu) -> QpAttributes {
        QpAttributes {
            state: QpState::Err,
            cur_state: QpState::Err,
            path_mtu: Some(path_mtu),
            path_mig_state: None,
            qkey: QKey(0),
            rq_psn: Psn::truncate(0),
            sq_psn: Psn::truncate(5),
            dest_qp_num: QpNum::new(0x12).unwrap(),
            access: AccessFlags::empty(),
            cap: QpCaps::default(),
            av,
            alt_av: AddressVector::new(1),
            pkey_index: 0,
            alt_pkey_index: 0,
            en_sqd_async_notify: false,
            sq_draining: false,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            min_rnr_timer: MinRnrTimer::new(12).unwrap(),
            port_num: 1,
            timeout: AckTimeout::new(14).unwrap(),
            retry_cnt: RetryCount::new(7).unwrap(),
            rnr_retry: RnrRetry::new(3).unwrap(),
            alt_port_num: 0,
            alt_timeout: AckTimeout::default(),
            rate_limit: RateLimit(0),
        }
    }

    fn port(link: u8, state: u32, active: Mtu) -> PortAttr {
        PortAttr::from_raw(&sys::ibv_port_attr {
            state,
            max_mtu: Mtu::Mtu4096.as_raw(),
            active_mtu: active.as_raw(),
            link_layer: link,
            ..Default::default()
        })
        .unwrap()
    }

    fn facts(av: AddressVector, path_mtu: Mtu, port_attr: PortAttr) -> ExplainFacts {
        ExplainFacts {
            qp_num: QpNum::new(0x11).unwrap(),
            qp_type: QpType::Rc,
            completion_qp_num: Some(QpNum::new(0x11).unwrap()),
            request: Some(RequestKind::Send),
            known_state: QpState::Err,
            attrs: Some(attrs(av, path_mtu)),
            port: Some(1),
            port_attr: Some(port_attr),
            sgid: None,
            outstanding_sends: 1,
            outstanding_recvs: 0,
            srq: false,
            first_failure: None,
            recv_bytes: None,
            vendor_err: 0,
            query_errors: Vec::new(),
        }
    }

    fn kinds(status: WcStatus, f: &ExplainFacts) -> Vec<CauseKind> {
        of(Ok(status), f).iter().map(Cause::kind).collect()
    }

    const IB: u8 = sys::IBV_LINK_LAYER_INFINIBAND as u8;
    const ETH: u8 = sys::IBV_LINK_LAYER_ETHERNET as u8;
    const ACTIVE: u32 = sys::ibv_port_state::IBV_PORT_ACTIVE;
    const DOWN: u32 = sys::ibv_port_state::IBV_PORT_DOWN;

    #[test]
    fn lid_0_on_infiniband_comes_first() {
        let f = facts(
            AddressVector::new(1),
            Mtu::Mtu1024,
            port(IB, ACTIVE, Mtu::Mtu4096),
        );
        assert_eq!(
            f.port_attr.as_ref().unwrap().link_layer,
            LinkLayer::InfiniBand
        );
        let k = kinds(WcStatus::RetryExcErr, &f);
        assert_eq!(
            k,
            [
                CauseKind::Lid0OnInfiniBand,
                CauseKind::PeerQp,
                CauseKind::AckTimeout
            ]
        );
        // A GRH does not route on InfiniBand: DLID 0 is still named.
        let dgid: Gid = "fe80::2".parse().unwrap();
        let av = AddressVector::new(1).global(GlobalRoute::new(dgid, 0));
        let f = facts(av, Mtu::Mtu1024, port(IB, ACTIVE, Mtu::Mtu4096));
        let c = of(Ok(WcStatus::RetryExcErr), &f);
        assert_eq!(c[0].kind(), CauseKind::Lid0OnInfiniBand);
        assert!(
            c[0].text().contains("a GRH does not replace it"),
            "{}",
            c[0]
        );
        // With a LID, the peer QP comes first.
        let f = facts(
            AddressVector::new(1).dlid(7),
            Mtu::Mtu1024,
            port(IB, ACTIVE, Mtu::Mtu4096),
        );
        let c = of(Ok(WcStatus::RetryExcErr), &f);
        assert_eq!(c[0].kind(), CauseKind::PeerQp);
        assert!(c[0].text().contains("peer QP 0x12 at LID 7"), "{}", c[0]);
    }

    #[test]
    fn roce_without_grh_port_down_and_path_mtu_are_named() {
        let f = facts(
            AddressVector::new(1),
            Mtu::Mtu4096,
            port(ETH, DOWN, Mtu::Mtu1024),
        );
        let k = kinds(WcStatus::RetryExcErr, &f);
        assert_eq!(
            k,
            [
                CauseKind::PortNotActive,
                CauseKind::NoGrhOnRoce,
                CauseKind::PeerQp,
                CauseKind::PathMtuAboveActive,
                CauseKind::AckTimeout
            ]
        );
        let c = of(Ok(WcStatus::RetryExcErr), &f);
        assert!(c[0].text().contains("port 1 is DOWN"), "{}", c[0]);
        assert!(
            c[3].text().contains("4096") && c[3].text().contains("1024"),
            "{}",
            c[3]
        );
        assert!(c[4].text().contains("8 tries"), "{}", c[4]);
    }

    #[test]
    fn a_grh_names_both_gids_and_the_source_type() {
        let dgid: Gid = "::ffff:10.99.0.2".parse().unwrap();
        let av = AddressVector::new(1).global(GlobalRoute::new(dgid, 1));
        let mut f = facts(av, Mtu::Mtu1024, port(ETH, ACTIVE, Mtu::Mtu1024));
        f.sgid = Some(GidEntry {
            gid: "::ffff:10.99.0.1".parse().unwrap(),
            index: 1,
            port: 1,
            gid_type: Some(GidType::RoceV2),
            ndev_ifindex: 0,
        });
        let c = of(Ok(WcStatus::RetryExcErr), &f);
        let k: Vec<_> = c.iter().map(Cause::kind).collect();
        assert_eq!(
            k,
            [CauseKind::PeerQp, CauseKind::GidPath, CauseKind::AckTimeout]
        );
        assert!(
            c[0].text().contains("peer QP 0x12 at GID ::ffff:10.99.0.2"),
            "{}",
            c[0]
        );
        assert!(
            c[1].text().contains("index 1 (RoCE v2 ::ffff:10.99.0.1)"),
            "{}",
            c[1]
        );
        let x = Explanation {
            status: Ok(WcStatus::RetryExcErr),
            causes: c,
            facts: f,
        };
        let text = x.to_string();
        assert!(text.starts_with("send-queue request on RC QP 0x11 failed: transport retry counter exceeded (IBV_WC_RETRY_EXC_ERR)\nlikely causes, most likely first:\n  1. "), "{text}");
        assert!(text.contains("path: dest QPN 0x12, DLID 0, GRH to ::ffff:10.99.0.2 from GID index 1 (RoCE v2 ::ffff:10.99.0.1), path MTU 1024"), "{text}");
        assert!(text.contains("retry_cnt 7, rnr_retry 3,"), "{text}");
    }

    #[test]
    fn every_status_has_a_cause_and_success_has_none_to_find() {
        let f = facts(
            AddressVector::new(1).dlid(3),
            Mtu::Mtu1024,
            port(IB, ACTIVE, Mtu::Mtu1024),
        );
        for s in WcStatus::ALL {
            let c = of(Ok(*s), &f);
            assert!(!c.is_empty(), "{s}");
            assert_eq!(
                c[0].kind() == CauseKind::NotFailed,
                *s == WcStatus::Success,
                "{s}"
            );
        }
        let c = of(Err(999), &f);
        assert_eq!(c[0].kind(), CauseKind::Device);
        assert!(c[0].text().contains("999"), "{}", c[0]);
        // Without any facts, nothing panics and the causes stay general.
        let mut bare = f.clone();
        bare.attrs = None;
        bare.port_attr = None;
        bare.port = None;
        for s in WcStatus::ALL {
            assert!(!of(Ok(*s), &bare).is_empty(), "{s}");
        }
    }

    #[test]
    fn rnr_flush_and_receive_length_name_their_facts() {
        let mut f = facts(
            AddressVector::new(1).dlid(3),
            Mtu::Mtu1024,
            port(IB, ACTIVE, Mtu::Mtu1024),
        );
        let c = of(Ok(WcStatus::RnrRetryExcErr), &f);
        assert!(
            c[0].text().contains("rnr_retry 3: it retried 3 times"),
            "{}",
            c[0]
        );
        let c = of(Ok(WcStatus::WrFlushErr), &f);
        assert!(c[0].text().contains("none reclaimed"), "{}", c[0]);
        f.first_failure = Some((Ok(WcStatus::LocLenErr), RequestKind::Recv));
        let c = of(Ok(WcStatus::WrFlushErr), &f);
        assert!(
            c[0].text().contains("IBV_WC_LOC_LEN_ERR) on a receive"),
            "{}",
            c[0]
        );
        f.request = Some(RequestKind::Recv);
        f.recv_bytes = Some(16);
        let c = of(Ok(WcStatus::LocLenErr), &f);
        assert_eq!(c[0].kind(), CauseKind::ReceiveTooShort);
        assert!(
            c[0].text().contains("receive's buffers (16 bytes)"),
            "{}",
            c[0]
        );
        // rxe's way of saying the same: LOC_QP_OP_ERR on the receive,
        // REM_OP_ERR on the send.
        let k = kinds(WcStatus::LocQpOpErr, &f);
        assert_eq!(
            k,
            [CauseKind::ReceiveTooShort, CauseKind::RequestInvalidForQp]
        );
        f.request = Some(RequestKind::Send);
        let k = kinds(WcStatus::LocQpOpErr, &f);
        assert_eq!(k, [CauseKind::RequestInvalidForQp]);
        let k = kinds(WcStatus::RemOpErr, &f);
        assert_eq!(k, [CauseKind::PeerReceiveTooShort, CauseKind::PeerResponse]);
    }
}
