/*
 * What the two QP bench programs in C (qp_setup.c, qp_scale.c) share: the
 * command line, opening the device and reading its port and GID, creating
 * an RC QP, and the RESET->INIT->RTR->RTS walk with the attributes of the
 * crate's QueuePair::connect (ibv_rc_pingpong's: P_Key index 0, no remote
 * access, active MTU, PSN 0, max_dest_rd_atomic 1, min_rnr_timer 12,
 * timeout 14, retry_cnt 7, rnr_retry 7, max_rd_atomic 1; a GRH from GID
 * index -x). Header only: each program includes it and is built alone
 * (cc -O2 .ci/bench/qp_setup.c -o qp_setup -libverbs).
 */
#ifndef QP_COMMON_H
#define QP_COMMON_H

#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The command line: [-d DEV] [-i PORT] [-x GIDIDX] [-n N]. */
struct qp_opts {
	const char *dev_name; /* NULL: the first device */
	int port;
	int gid_index; /* -1: no GRH */
	int n;
};

/* The opened device, its port's attributes and GID -x (zero without -x). */
struct qp_dev {
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_port_attr pa;
	union ibv_gid gid;
};

/* Reads the options into o (whose fields hold the defaults); 0, or 2
 * after printing the usage. */
static int qp_parse(int argc, char **argv, struct qp_opts *o)
{
	int opt;

	while ((opt = getopt(argc, argv, "d:i:x:n:")) != -1) {
		switch (opt) {
		case 'd': o->dev_name = optarg; break;
		case 'i': o->port = atoi(optarg); break;
		case 'x': o->gid_index = atoi(optarg); break;
		case 'n': o->n = atoi(optarg); break;
		default:
			fprintf(stderr, "usage: %s [-d DEV] [-i PORT] [-x GIDIDX] [-n N]\n", argv[0]);
			return 2;
		}
	}
	return 0;
}

/* Closes what qp_open opened (either field may be NULL). */
static void qp_close(struct qp_dev *d)
{
	if (d->ctx)
		ibv_close_device(d->ctx);
	if (d->list)
		ibv_free_device_list(d->list);
}

/* Opens o's device and reads its port and GID; 0, or 1 after saying why
 * (prefixed with prog) with nothing left open. */
static int qp_open(const char *prog, const struct qp_opts *o, struct qp_dev *d)
{
	int i, num, err;

	memset(d, 0, sizeof(*d));
	d->list = ibv_get_device_list(&num);
	if (!d->list || num == 0) {
		fprintf(stderr, "%s: no RDMA devices\n", prog);
		qp_close(d);
		return 1;
	}
	for (i = 0; i < num; i++)
		if (!o->dev_name || !strcmp(ibv_get_device_name(d->list[i]), o->dev_name))
			break;
	if (i == num) {
		fprintf(stderr, "%s: device %s not found\n", prog, o->dev_name);
		qp_close(d);
		return 1;
	}
	d->ctx = ibv_open_device(d->list[i]);
	if (!d->ctx) {
		fprintf(stderr, "%s: ibv_open_device failed\n", prog);
		qp_close(d);
		return 1;
	}
	if ((err = ibv_query_port(d->ctx, o->port, &d->pa))) {
		fprintf(stderr, "%s: ibv_query_port failed: %s\n", prog, strerror(err));
		qp_close(d);
		return 1;
	}
	if (o->gid_index >= 0 && ibv_query_gid(d->ctx, o->port, o->gid_index, &d->gid)) {
		fprintf(stderr, "%s: ibv_query_gid failed\n", prog);
		qp_close(d);
		return 1;
	}
	return 0;
}

/* An RC QP of depth `depth` each way, one SGE each way, or NULL. */
static struct ibv_qp *qp_new_rc(struct ibv_pd *pd, struct ibv_cq *scq,
				struct ibv_cq *rcq, int depth)
{
	struct ibv_qp_init_attr ia;

	memset(&ia, 0, sizeof(ia));
	ia.send_cq = scq;
	ia.recv_cq = rcq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = depth;
	ia.cap.max_recv_wr = depth;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	return ibv_create_qp(pd, &ia);
}

/* Moves qp RESET->INIT->RTR->RTS towards dest_qpn on d's port o->port;
 * 0, or the failed ibv_modify_qp's error. *step names the transition. */
static int qp_to_rts(struct ibv_qp *qp, const struct qp_opts *o,
		     const struct qp_dev *d, uint32_t dest_qpn, const char **step)
{
	struct ibv_qp_attr a;
	int err;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = o->port;
	a.qp_access_flags = 0;
	*step = "INIT";
	if ((err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
				 IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)))
		return err;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = d->pa.active_mtu;
	a.dest_qp_num = dest_qpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.dlid = d->pa.lid;
	a.ah_attr.port_num = o->port;
	if (o->gid_index >= 0) {
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = d->gid;
		a.ah_attr.grh.sgid_index = o->gid_index;
		a.ah_attr.grh.hop_limit = 1;
	}
	*step = "RTR";
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
	*step = "RTS";
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
			     IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* Destroys the CQs and the PD that are not NULL (rcq may be scq), then
 * closes the device. */
static void qp_release(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
		       struct qp_dev *d)
{
	if (rcq && rcq != scq)
		ibv_destroy_cq(rcq);
	if (scq)
		ibv_destroy_cq(scq);
	if (pd)
		ibv_dealloc_pd(pd);
	qp_close(d);
}

/* The monotonic clock, in seconds. */
static double qp_now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + t.tv_nsec / 1e9;
}

#endif
