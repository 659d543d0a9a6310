//! The CM on tokio: 16 clients connected at once to one listener, each
//! connection served by its own task on the listener's channel (its events
//! routed to it), messages each way, then disconnected; a `get_request`
//! and a `connect` dropped at their await points with the event delivered
//! to the next wait; an id of another channel refused.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::pin;
use std::time::Duration;

use libtest_mimic::Failed;
use rdma_verbs::cm::{CmEventKind, CmId, ConnParam, PortSpace};
use rdma_verbs::qp::{RecvWr, SendOp, SendWr};
use rdma_verbs::tokio::{AsyncCmChannel, AsyncCq};
use rdma_verbs::{AccessFlags, Error, QpCaps, QpInitAttr, QpType, QueuePair, WorkCompletion};

use crate::common::{cm_addr, Env, Test};

pub const TESTS: &[Test] = tests![
    sixteen_connections_a_task_each,
    dropped_get_request_and_connect_lose_no_event,
    an_id_of_another_channel_is_refused,
    event_streams_yield_request_and_rejection,
];

const T: Duration = Duration::from_secs(2);

async fn listen(env: &Env, ch: &AsyncCmChannel) -> Result<(CmId, SocketAddr), Failed> {
    let l = ch.create_id(PortSpace::Tcp)?;
    l.bind(SocketAddr::new(cm_addr(env)?, 0))?;
    l.listen(128)?;
    let addr = l.local_addr().ok_or("no local address")?;
    Ok((l, addr))
}

/// A CM QP on `id` with its own AsyncCq, and one receive posted.
fn qp_on(id: &CmId) -> Result<(QueuePair, AsyncCq), Failed> {
    let ctx = id.context()?;
    let pd = ctx.alloc_pd()?;
    let cq = AsyncCq::new(&ctx, 16)?;
    let attr = QpInitAttr::new(QpType::Rc, cq.cq(), cq.cq()).caps(QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        ..QpCaps::default()
    });
    let mut qp = id.create_qp(&pd, &attr)?;
    let c = pd.alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?;
    qp.post_recv(
        c.into_iter()
            .map(|c| RecvWr::new(0).sge(c))
            .collect::<Vec<_>>(),
    )?;
    Ok((qp, cq))
}

/// Waits for one completion of `kind` on `qp`, reclaims it, returns its chunk.
async fn one(
    qp: &mut QueuePair,
    cq: &mut AsyncCq,
) -> Result<(rdma_verbs::qp::RequestKind, rdma_verbs::Chunk, u32), Failed> {
    let mut wcs = [WorkCompletion::default(); 1];
    let wc = cq.poll(&mut wcs).await?[0];
    ensure!(wc.is_success(), "{wc:?}");
    let done = qp.reclaim_one(&wc).ok_or("nothing reclaimed")?;
    let kind = done.kind;
    Ok((kind, done.into_chunk().ok_or("no chunk")?, wc.byte_len()))
}

fn sixteen_connections_a_task_each(env: &Env) -> Result<(), Failed> {
    crate::run_for(crate::limit() * 3, async {
        let sch = AsyncCmChannel::new()?;
        let (listener, addr) = listen(env, &sch).await?;
        let server = {
            let sch = sch.clone();
            tokio::spawn(async move {
                let mut conns = Vec::new();
                for _ in 0..16 {
                    let mut req = sch.get_request(&listener).await?;
                    let id = req.take_request().ok_or("no request id")?;
                    drop(req);
                    let sch = sch.clone();
                    conns.push(tokio::spawn(async move {
                        let (mut qp, mut cq) = qp_on(&id)?;
                        sch.accept(&id, &ConnParam::new()).await?;
                        // Echo one message, then wait for the disconnect.
                        let (kind, chunk, len) = one(&mut qp, &mut cq).await?;
                        ensure!(kind == rdma_verbs::qp::RequestKind::Recv, "{kind:?}");
                        qp.post_send([SendWr::new(1, SendOp::Send).sge_len(chunk, len as usize)])?;
                        one(&mut qp, &mut cq).await?;
                        let ev = sch.next_event_for(&id).await?;
                        ensure!(ev.kind() == CmEventKind::Disconnected, "{}", ev.kind());
                        Ok::<(), Failed>(())
                    }));
                }
                for c in conns {
                    c.await.map_err(|e| e.to_string())??;
                }
                Ok::<(), Failed>(())
            })
        };
        let mut clients = Vec::new();
        for k in 0..16u8 {
            clients.push(tokio::spawn(async move {
                let ch = AsyncCmChannel::new()?;
                let id = ch.create_id(PortSpace::Tcp)?;
                ch.resolve_addr(&id, None, addr, T).await?;
                ch.resolve_route(&id, T).await?;
                let (mut qp, mut cq) = qp_on(&id)?;
                let ev = ch.connect(&id, &ConnParam::new()).await?;
                ensure!(ev.kind() == CmEventKind::Established, "{}", ev.kind());
                drop(ev);
                let mut c = qp
                    .pd()
                    .alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?
                    .pop()
                    .unwrap();
                c.as_mut_slice()[..3].copy_from_slice(&[k, k, k]);
                qp.post_send([SendWr::new(1, SendOp::Send).sge_len(c, 3)])?;
                let mut echoed = false;
                for _ in 0..2 {
                    let (kind, chunk, len) = one(&mut qp, &mut cq).await?;
                    if kind == rdma_verbs::qp::RequestKind::Recv {
                        ensure!(
                            len == 3 && chunk.as_slice()[..3] == [k, k, k],
                            "echo {:?}",
                            &chunk.as_slice()[..3]
                        );
                        echoed = true;
                    }
                }
                ensure!(echoed, "client {k}: no echo");
                let ev = ch.disconnect(&id).await?;
                ensure!(ev.kind() == CmEventKind::Disconnected, "{}", ev.kind());
                Ok::<(), Failed>(())
            }));
        }
        for c in clients {
            c.await.map_err(|e| e.to_string())??;
        }
        server.await.map_err(|e| e.to_string())??;
        Ok(())
    })
}

fn dropped_get_request_and_connect_lose_no_event(env: &Env) -> Result<(), Failed> {
    crate::run_for(crate::limit() * 2, async {
        let sch = AsyncCmChannel::new()?;
        let (listener, addr) = listen(env, &sch).await?;
        // A get_request dropped at its await point, many times.
        for _ in 0..10 {
            let r =
                tokio::time::timeout(Duration::from_millis(2), sch.get_request(&listener)).await;
            ensure!(r.is_err(), "a request with no client");
        }
        let cch = AsyncCmChannel::new()?;
        let id = cch.create_id(PortSpace::Tcp)?;
        cch.resolve_addr(&id, None, addr, T).await?;
        cch.resolve_route(&id, T).await?;
        let (_qp, _cq) = qp_on(&id)?;
        {
            // The connect request goes out in the first poll; the future is
            // dropped before the answer.
            let param = ConnParam::new();
            let mut fut = pin!(cch.connect(&id, &param));
            let waker = crate::noop_waker();
            let mut cx = std::task::Context::from_waker(&waker);
            ensure!(fut.as_mut().poll(&mut cx).is_pending(), "connected at once");
        }
        let mut req = sch.get_request(&listener).await?;
        let sid = req.take_request().ok_or("no request id")?;
        drop(req);
        let (_sqp, _scq) = qp_on(&sid)?;
        // The accept's wait dropped too: ESTABLISHED still comes to the
        // next wait for the id.
        {
            let param = ConnParam::new();
            let mut fut = pin!(sch.accept(&sid, &param));
            let waker = crate::noop_waker();
            let mut cx = std::task::Context::from_waker(&waker);
            let _ = fut.as_mut().poll(&mut cx);
        }
        let ev = tokio::time::timeout(crate::limit(), cch.expect(&id, CmEventKind::Established))
            .await??;
        drop(ev);
        let ev = tokio::time::timeout(crate::limit(), sch.expect(&sid, CmEventKind::Established))
            .await??;
        drop(ev);
        // Both sides disconnect: the client's DISCONNECTED comes with the
        // server's answer to its DREQ (the server's own disconnect).
        let (c, s) = tokio::join!(cch.disconnect(&id), sch.disconnect(&sid));
        ensure!(c?.kind() == CmEventKind::Disconnected, "client");
        ensure!(s?.kind() == CmEventKind::Disconnected, "server");
        Ok(())
    })
}

fn an_id_of_another_channel_is_refused(env: &Env) -> Result<(), Failed> {
    crate::run_for(crate::limit(), async {
        let (a, b) = (AsyncCmChannel::new()?, AsyncCmChannel::new()?);
        let id = a.create_id(PortSpace::Tcp)?;
        let _ = env;
        let e = b
            .resolve_addr(&id, None, "127.0.0.1:1".parse().unwrap(), T)
            .await
            .unwrap_err();
        ensure!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
        let e = b.next_event_for(&id).await.unwrap_err();
        ensure!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
        Ok(())
    })
}

/// The `events()` streams of two channels: the server's yields the
/// request, which is rejected by dropping it untaken; the client's
/// yields `REJECTED`.
fn event_streams_yield_request_and_rejection(env: &Env) -> Result<(), Failed> {
    use futures_core::Stream;
    async fn next(
        s: &mut rdma_verbs::tokio::CmEvents<'_>,
    ) -> Result<rdma_verbs::cm::CmEvent, Failed> {
        let item = std::future::poll_fn(|cx| std::pin::Pin::new(&mut *s).poll_next(cx)).await;
        Ok(item.ok_or("the stream ended")??)
    }
    crate::run_for(crate::limit(), async {
        let sch = AsyncCmChannel::new()?;
        let (_listener, addr) = listen(env, &sch).await?;
        let cch = AsyncCmChannel::new()?;
        let id = cch.create_id(PortSpace::Tcp)?;
        id.resolve_addr(None, addr, T)?;
        let mut cs = cch.events();
        ensure!(
            next(&mut cs).await?.kind() == CmEventKind::AddrResolved,
            "addr"
        );
        id.resolve_route(T)?;
        ensure!(
            next(&mut cs).await?.kind() == CmEventKind::RouteResolved,
            "route"
        );
        let (_qp, _cq) = qp_on(&id)?;
        id.connect(&ConnParam::new())?;
        let mut ss = sch.events();
        let req = next(&mut ss).await?;
        ensure!(req.kind() == CmEventKind::ConnectRequest, "{}", req.kind());
        drop(req); // untaken: rejected
        let ev = next(&mut cs).await?;
        ensure!(ev.kind() == CmEventKind::Rejected, "{}", ev.kind());
        Ok(())
    })
}
