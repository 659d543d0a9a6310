/*
 * QP setup rate through plain libibverbs: the C side of the crate's
 * examples/perf_setup.rs, doing the same thing with the same options.
 *
 * N times: create an RC QP on one PD and CQ, move it RESET->INIT->RTR->RTS
 * (RTR to a second QP on the same device: loopback, GRH with GID index -x),
 * destroy it. Prints
 *   qp_setup: path=c qps=N seconds=S per_sec=R
 *
 * Build: cc -O2 .ci/bench/qp_setup.c -o qp_setup -libverbs
 * Usage: qp_setup [-d DEV] [-i PORT] [-x GIDIDX] [-n N]
 */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int fail(const char *what, int err)
{
	fprintf(stderr, "qp_setup: %s failed: %s\n", what, strerror(err));
	return 1;
}

static struct ibv_qp *new_rc(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr ia;

	memset(&ia, 0, sizeof(ia));
	ia.send_cq = cq;
	ia.recv_cq = cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = 16;
	ia.cap.max_recv_wr = 16;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	return ibv_create_qp(pd, &ia);
}

int main(int argc, char **argv)
{
	const char *dev_name = NULL;
	int port = 1, gid_index = -1, n = 200, opt, i, num, ret = 1, err;
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	struct ibv_pd *pd = NULL;
	struct ibv_cq *cq = NULL;
	struct ibv_qp *peer = NULL;
	struct ibv_port_attr pa;
	union ibv_gid gid;
	struct timespec t0, t1;
	double secs;

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
	if (n <= 0 || port <= 0 || port > 255) {
		fprintf(stderr, "qp_setup: bad -n or -i\n");
		return 2;
	}

	list = ibv_get_device_list(&num);
	if (!list || num == 0) {
		fprintf(stderr, "qp_setup: no RDMA devices\n");
		return 1;
	}
	for (i = 0; i < num; i++)
		if (!dev_name || !strcmp(ibv_get_device_name(list[i]), dev_name))
			break;
	if (i == num) {
		fprintf(stderr, "qp_setup: device %s not found\n", dev_name);
		goto out_list;
	}
	ctx = ibv_open_device(list[i]);
	if (!ctx) {
		fprintf(stderr, "qp_setup: ibv_open_device failed\n");
		goto out_list;
	}
	if ((err = ibv_query_port(ctx, port, &pa))) {
		ret = fail("ibv_query_port", err);
		goto out_ctx;
	}
	memset(&gid, 0, sizeof(gid));
	if (gid_index >= 0 && ibv_query_gid(ctx, port, gid_index, &gid)) {
		fprintf(stderr, "qp_setup: ibv_query_gid failed\n");
		goto out_ctx;
	}
	pd = ibv_alloc_pd(ctx);
	cq = pd ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
	peer = cq ? new_rc(pd, cq) : NULL;
	if (!peer) {
		fprintf(stderr, "qp_setup: PD, CQ or peer QP creation failed\n");
		goto out_res;
	}

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (i = 0; i < n; i++) {
		struct ibv_qp_attr a;
		struct ibv_qp *qp = new_rc(pd, cq);

		if (!qp) {
			fprintf(stderr, "qp_setup: ibv_create_qp failed (QP %d)\n", i);
			goto out_res;
		}

		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_INIT;
		a.pkey_index = 0;
		a.port_num = port;
		a.qp_access_flags = 0;
		if ((err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
					 IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))) {
			ibv_destroy_qp(qp);
			ret = fail("ibv_modify_qp INIT", err);
			goto out_res;
		}

		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_RTR;
		a.path_mtu = pa.active_mtu;
		a.dest_qp_num = peer->qp_num;
		a.rq_psn = 0;
		a.max_dest_rd_atomic = 1;
		a.min_rnr_timer = 12;
		a.ah_attr.dlid = pa.lid;
		a.ah_attr.port_num = port;
		if (gid_index >= 0) {
			a.ah_attr.is_global = 1;
			a.ah_attr.grh.dgid = gid;
			a.ah_attr.grh.sgid_index = gid_index;
			a.ah_attr.grh.hop_limit = 1;
		}
		if ((err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV |
					 IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					 IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
					 IBV_QP_MIN_RNR_TIMER))) {
			ibv_destroy_qp(qp);
			ret = fail("ibv_modify_qp RTR", err);
			goto out_res;
		}

		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_RTS;
		a.timeout = 14;
		a.retry_cnt = 7;
		a.rnr_retry = 7;
		a.sq_psn = 0;
		a.max_rd_atomic = 1;
		if ((err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
					 IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					 IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))) {
			ibv_destroy_qp(qp);
			ret = fail("ibv_modify_qp RTS", err);
			goto out_res;
		}

		if ((err = ibv_destroy_qp(qp))) {
			ret = fail("ibv_destroy_qp", err);
			goto out_res;
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	secs = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
	printf("qp_setup: path=c qps=%d seconds=%.6f per_sec=%.1f\n", n, secs,
	       secs > 0 ? n / secs : 0.0);
	ret = 0;

out_res:
	if (peer)
		ibv_destroy_qp(peer);
	if (cq)
		ibv_destroy_cq(cq);
	if (pd)
		ibv_dealloc_pd(pd);
out_ctx:
	ibv_close_device(ctx);
out_list:
	ibv_free_device_list(list);
	return ret;
}
