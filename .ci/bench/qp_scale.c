/*
 * Many connected RC QPs in one process through plain libibverbs: the C
 * side of the crate's examples/perf_scale.rs, doing the same thing with the
 * same options.
 *
 * One PD and one CQ pair (a send CQ and a receive CQ, shared by every QP);
 * N RC QPs (default 1000) of depth 64/64, one SGE each way, made as
 * N/2 loopback pairs on one port (QP 2i and QP 2i+1 are each other's peer):
 * every QP goes RESET->INIT->RTR->RTS with the attributes of the crate's
 * QueuePair::connect (ibv_rc_pingpong's: P_Key index 0, no remote access,
 * active MTU, PSN 0, max_dest_rd_atomic 1, min_rnr_timer 12, timeout 14,
 * retry_cnt 7, rnr_retry 7, max_rd_atomic 1; a GRH from GID index -x).
 * The port and the GID are read once, before the clock starts. Then every
 * QP is destroyed. Prints
 *   qp_scale: path=c qps=N setup_s=S teardown_s=T rss_kib=R
 * where setup is creating and connecting all N QPs, teardown destroying
 * them, and rss_kib the growth of the process's VmRSS (/proc/self/status)
 * from before the first QP to after the last one is connected.
 *
 * Build: cc -O2 .ci/bench/qp_scale.c -o qp_scale -libverbs
 * Usage: qp_scale [-d DEV] [-i PORT] [-x GIDIDX] [-n N]   (N even)
 */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DEPTH 64

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + t.tv_nsec / 1e9;
}

/* VmRSS of this process in KiB, or -1. */
static long vm_rss(void)
{
	char line[256];
	long kib = -1;
	FILE *f = fopen("/proc/self/status", "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
			break;
	fclose(f);
	return kib;
}

static int to_rts(struct ibv_qp *qp, int port, const struct ibv_port_attr *pa,
		  int gid_index, const union ibv_gid *gid, uint32_t dest_qpn)
{
	struct ibv_qp_attr a;
	int err;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = port;
	a.qp_access_flags = 0;
	if ((err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
				 IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)))
		return err;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = pa->active_mtu;
	a.dest_qp_num = dest_qpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.dlid = pa->lid;
	a.ah_attr.port_num = port;
	if (gid_index >= 0) {
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = *gid;
		a.ah_attr.grh.sgid_index = gid_index;
		a.ah_attr.grh.hop_limit = 1;
	}
	if ((err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV |
				 IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				 IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				 IBV_QP_MIN_RNR_TIMER)))
		return err;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
			     IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

int main(int argc, char **argv)
{
	const char *dev_name = NULL;
	int port = 1, gid_index = -1, n = 1000, opt, i, num, ret = 1, err, made = 0;
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	struct ibv_pd *pd = NULL;
	struct ibv_cq *scq = NULL, *rcq = NULL;
	struct ibv_qp **qps = NULL;
	struct ibv_port_attr pa;
	union ibv_gid gid;
	double t0, t1, t2;
	long rss0, rss1;

	while ((opt = getopt(argc, argv, "d:i:x:n:")) != -1) {
		switch (opt) {
		case 'd': dev_name = optarg; break;
		case 'i': port = atoi(optarg); break;
		case 'x': gid_index = atoi(optarg); break;
		case 'n': n = atoi(optarg); break;
		default:
			fprintf(stderr, "usage: %s [-d DEV] [-i PORT] [-x GIDIDX] [-n N]\n", argv[0]);
			return 2;
		}
	}
	if (n <= 0 || n % 2 || port <= 0 || port > 255) {
		fprintf(stderr, "qp_scale: bad -n (a positive even count) or -i\n");
		return 2;
	}

	list = ibv_get_device_list(&num);
	if (!list || num == 0) {
		fprintf(stderr, "qp_scale: no RDMA devices\n");
		return 1;
	}
	for (i = 0; i < num; i++)
		if (!dev_name || !strcmp(ibv_get_device_name(list[i]), dev_name))
			break;
	if (i == num) {
		fprintf(stderr, "qp_scale: device %s not found\n", dev_name);
		goto out_list;
	}
	ctx = ibv_open_device(list[i]);
	if (!ctx) {
		fprintf(stderr, "qp_scale: ibv_open_device failed\n");
		goto out_list;
	}
	if ((err = ibv_query_port(ctx, port, &pa))) {
		fprintf(stderr, "qp_scale: ibv_query_port failed: %s\n", strerror(err));
		goto out_ctx;
	}
	memset(&gid, 0, sizeof(gid));
	if (gid_index >= 0 && ibv_query_gid(ctx, port, gid_index, &gid)) {
		fprintf(stderr, "qp_scale: ibv_query_gid failed\n");
		goto out_ctx;
	}
	qps = calloc(n, sizeof(*qps));
	pd = qps ? ibv_alloc_pd(ctx) : NULL;
	scq = pd ? ibv_create_cq(ctx, 4096, NULL, NULL, 0) : NULL;
	rcq = scq ? ibv_create_cq(ctx, 4096, NULL, NULL, 0) : NULL;
	if (!rcq) {
		fprintf(stderr, "qp_scale: PD or CQ creation failed\n");
		goto out_res;
	}

	rss0 = vm_rss();
	t0 = now();
	for (made = 0; made < n; made++) {
		struct ibv_qp_init_attr ia;

		memset(&ia, 0, sizeof(ia));
		ia.send_cq = scq;
		ia.recv_cq = rcq;
		ia.qp_type = IBV_QPT_RC;
		ia.cap.max_send_wr = DEPTH;
		ia.cap.max_recv_wr = DEPTH;
		ia.cap.max_send_sge = 1;
		ia.cap.max_recv_sge = 1;
		qps[made] = ibv_create_qp(pd, &ia);
		if (!qps[made]) {
			fprintf(stderr, "qp_scale: ibv_create_qp failed (QP %d)\n", made);
			goto out_qps;
		}
	}
	for (i = 0; i < n; i++) {
		if ((err = to_rts(qps[i], port, &pa, gid_index, &gid, qps[i ^ 1]->qp_num))) {
			fprintf(stderr, "qp_scale: connecting QP %d failed: %s\n", i, strerror(err));
			goto out_qps;
		}
	}
	t1 = now();
	rss1 = vm_rss();
	for (i = 0; i < n; i++) {
		err = ibv_destroy_qp(qps[i]);
		qps[i] = NULL;
		if (err) {
			fprintf(stderr, "qp_scale: ibv_destroy_qp failed: %s\n", strerror(err));
			goto out_qps;
		}
	}
	t2 = now();
	printf("qp_scale: path=c qps=%d setup_s=%.6f teardown_s=%.6f rss_kib=%ld\n",
	       n, t1 - t0, t2 - t1, rss1 - rss0);
	ret = 0;

out_qps:
	for (i = 0; i < made; i++)
		if (qps[i])
			ibv_destroy_qp(qps[i]);
out_res:
	if (rcq)
		ibv_destroy_cq(rcq);
	if (scq)
		ibv_destroy_cq(scq);
	if (pd)
		ibv_dealloc_pd(pd);
	free(qps);
out_ctx:
	ibv_close_device(ctx);
out_list:
	ibv_free_device_list(list);
	return ret;
}
