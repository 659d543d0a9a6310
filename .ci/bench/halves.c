// Two threads on one QP, in C: the other side of examples/perf_halves.rs,
// doing the same thing with the same settings.
//
//   halves [-d DEV] [-i PORT] [-x GIDIDX] [-n N] [-s SIZE]
//
// Two RC QPs of depth 64 in loopback on one port, each sending N messages
// of SIZE bytes to the other. The send thread posts both QPs' sends
// (signalled) while the peer has a receive posted (credits raised by the
// receive thread) and reaps the send CQ; the receive thread keeps 64
// receives posted on each QP and posts each buffer again as it reaps it.
// libibverbs lets the two threads post to one QP's two queues at once.
// Prints "perf_halves: path=c messages=M seconds=S".
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DEPTH 64

static unsigned long n = 100000;
static size_t size = 64;
static struct ibv_qp *qp[2];
static struct ibv_cq *scq, *rcq;
static struct ibv_mr *mr;
static char *buf;
static atomic_ulong credits[2];

static void die(const char *what)
{
    perror(what);
    exit(1);
}

// Buffer i of QP q: sends 0..DEPTH-1, then receives DEPTH..2*DEPTH-1.
static struct ibv_sge sge_of(int q, int i)
{
    struct ibv_sge s = {
        .addr = (uintptr_t)(buf + ((size_t)q * 2 * DEPTH + i) * size),
        .length = (uint32_t)size,
        .lkey = mr->lkey,
    };
    return s;
}

static int which(uint32_t qp_num)
{
    return qp_num == qp[1]->qp_num;
}

__attribute__((noinline)) static void post_recv(int q, int i)
{
    struct ibv_sge s = sge_of(q, DEPTH + i);
    struct ibv_recv_wr wr = {.wr_id = (uint64_t)i, .sg_list = &s, .num_sge = 1}, *bad;
    if (ibv_post_recv(qp[q], &wr, &bad))
        die("ibv_post_recv");
}

// The data path's functions (kept apart, so that the bench counts their
// instructions per message): post a send, post a receive.
__attribute__((noinline)) static void post_send(int q, unsigned long i)
{
    struct ibv_sge s = sge_of(q, (int)(i % DEPTH));
    struct ibv_send_wr wr = {
        .wr_id = i, .sg_list = &s, .num_sge = 1,
        .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED,
    }, *bad;
    if (ibv_post_send(qp[q], &wr, &bad))
        die("ibv_post_send");
}

// Polls cq for up to 16 completions into wc; exits if the poll or any
// completion (of a `what`: "send", "receive") failed.
static int poll_ok(struct ibv_cq *cq, struct ibv_wc *wc, const char *what)
{
    int got = ibv_poll_cq(cq, 16, wc);
    if (got < 0)
        die("ibv_poll_cq");
    for (int k = 0; k < got; k++) {
        if (wc[k].status != IBV_WC_SUCCESS) {
            fprintf(stderr, "%s failed: %s\n", what, ibv_wc_status_str(wc[k].status));
            exit(1);
        }
    }
    return got;
}

static void *send_thread(void *arg)
{
    unsigned long sent[2] = {0, 0}, done[2] = {0, 0}, total = 0;
    struct ibv_wc wc[16];
    (void)arg;
    while (total < 2 * n) {
        for (int q = 0; q < 2; q++) {
            unsigned long room = atomic_load_explicit(&credits[q ^ 1], memory_order_acquire);
            while (sent[q] < n && sent[q] < room && sent[q] - done[q] < DEPTH) {
                post_send(q, sent[q]);
                sent[q]++;
            }
        }
        int got = poll_ok(scq, wc, "send");
        for (int k = 0; k < got; k++) {
            done[which(wc[k].qp_num)]++;
            total++;
        }
    }
    return NULL;
}

static void recv_loop(void)
{
    unsigned long got_all = 0;
    struct ibv_wc wc[16];
    while (got_all < 2 * n) {
        int got = poll_ok(rcq, wc, "receive");
        for (int k = 0; k < got; k++) {
            int q = which(wc[k].qp_num);
            post_recv(q, (int)wc[k].wr_id);
            atomic_fetch_add_explicit(&credits[q], 1, memory_order_release);
            got_all++;
        }
    }
}

static void connect_qp(struct ibv_qp *me, uint32_t peer, int port, int gidx,
                       union ibv_gid *gid, enum ibv_mtu mtu, uint16_t lid)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = (uint8_t)port};
    if (ibv_modify_qp(me, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        die("INIT");
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = mtu;
    a.dest_qp_num = peer;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.dlid = lid;
    a.ah_attr.port_num = (uint8_t)port;
    if (gidx >= 0) {
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = *gid;
        a.ah_attr.grh.sgid_index = (uint8_t)gidx;
        a.ah_attr.grh.hop_limit = 1;
    }
    if (ibv_modify_qp(me, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        die("RTR");
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    if (ibv_modify_qp(me, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
        die("RTS");
}

int main(int argc, char **argv)
{
    const char *dev = NULL;
    int port = 1, gidx = -1, c;
    while ((c = getopt(argc, argv, "d:i:x:n:s:")) != -1) {
        switch (c) {
        case 'd': dev = optarg; break;
        case 'i': port = atoi(optarg); break;
        case 'x': gidx = atoi(optarg); break;
        case 'n': n = strtoul(optarg, NULL, 0); break;
        case 's': size = strtoul(optarg, NULL, 0); break;
        default:
            fprintf(stderr, "usage: halves [-d DEV] [-i PORT] [-x GIDIDX] [-n N] [-s SIZE]\n");
            return 2;
        }
    }
    if (n == 0 || size == 0) {
        fprintf(stderr, "halves: -n and -s must be positive\n");
        return 2;
    }
    int num;
    struct ibv_device **list = ibv_get_device_list(&num);
    if (!list || num == 0)
        die("no RDMA device");
    int d = 0;
    while (dev && d < num && strcmp(ibv_get_device_name(list[d]), dev))
        d++;
    if (d == num)
        die("no such device");
    struct ibv_context *ctx = ibv_open_device(list[d]);
    if (!ctx)
        die("ibv_open_device");
    struct ibv_port_attr pa;
    union ibv_gid gid = {0};
    if (ibv_query_port(ctx, (uint8_t)port, &pa) || (gidx >= 0 && ibv_query_gid(ctx, (uint8_t)port, gidx, &gid)))
        die("ibv_query_port/gid");
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    buf = calloc(4 * DEPTH, size);
    if (!pd || !buf)
        die("ibv_alloc_pd");
    mr = ibv_reg_mr(pd, buf, 4 * DEPTH * size, IBV_ACCESS_LOCAL_WRITE);
    scq = ibv_create_cq(ctx, 2 * DEPTH, NULL, NULL, 0);
    rcq = ibv_create_cq(ctx, 2 * DEPTH, NULL, NULL, 0);
    if (!mr || !scq || !rcq)
        die("ibv_reg_mr/ibv_create_cq");
    struct ibv_qp_init_attr ia = {
        .send_cq = scq, .recv_cq = rcq, .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = DEPTH, .max_recv_wr = DEPTH, .max_send_sge = 1, .max_recv_sge = 1},
    };
    for (int q = 0; q < 2; q++)
        if (!(qp[q] = ibv_create_qp(pd, &ia)))
            die("ibv_create_qp");
    for (int q = 0; q < 2; q++)
        connect_qp(qp[q], qp[q ^ 1]->qp_num, port, gidx, &gid, pa.active_mtu, pa.lid);
    for (int q = 0; q < 2; q++) {
        for (int i = 0; i < DEPTH; i++)
            post_recv(q, i);
        atomic_store(&credits[q], DEPTH);
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_t tx;
    if (pthread_create(&tx, NULL, send_thread, NULL))
        die("pthread_create");
    recv_loop();
    pthread_join(tx, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("perf_halves: path=c messages=%lu seconds=%.6f\n", 2 * n, secs);
    for (int q = 0; q < 2; q++)
        ibv_destroy_qp(qp[q]);
    ibv_destroy_cq(scq);
    ibv_destroy_cq(rcq);
    ibv_dereg_mr(mr);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    free(buf);
    return 0;
}
