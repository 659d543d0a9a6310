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
 * Build: cc -O2 .ci/bench/qp_scale.c -o qp_scale -libverbs  (qp_common.h
 * beside it holds the command line, the device and the QP transitions)
 * Usage: qp_scale [-d DEV] [-i PORT] [-x GIDIDX] [-n N]   (N even)
 */
#include "qp_common.h"

#define DEPTH 64

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

/* Destroys the QPs in qps[0..n) that are still there. */
static void destroy_all(struct ibv_qp **qps, int n)
{
	int i;

	for (i = 0; i < n; i++)
		if (qps[i])
			ibv_destroy_qp(qps[i]);
}

/* Creates o->n QPs into qps and connects each to its pair's other QP;
 * 0, or 1 after saying why (the QPs made are left in qps). */
static int setup(const struct qp_opts *o, const struct qp_dev *d, struct ibv_pd *pd,
		 struct ibv_cq *scq, struct ibv_cq *rcq, struct ibv_qp **qps)
{
	const char *step;
	int i, err;

	for (i = 0; i < o->n; i++) {
		qps[i] = qp_new_rc(pd, scq, rcq, DEPTH);
		if (!qps[i]) {
			fprintf(stderr, "qp_scale: ibv_create_qp failed (QP %d)\n", i);
			return 1;
		}
	}
	for (i = 0; i < o->n; i++) {
		if ((err = qp_to_rts(qps[i], o, d, qps[i ^ 1]->qp_num, &step))) {
			fprintf(stderr, "qp_scale: connecting QP %d failed (%s): %s\n", i, step,
				strerror(err));
			return 1;
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct qp_opts o = {.dev_name = NULL, .port = 1, .gid_index = -1, .n = 1000};
	struct qp_dev d;
	struct ibv_pd *pd = NULL;
	struct ibv_cq *scq = NULL, *rcq = NULL;
	struct ibv_qp **qps = NULL;
	double t0, t1, t2;
	long rss0, rss1;
	int i, ret = 1, err;

	if (qp_parse(argc, argv, &o))
		return 2;
	if (o.n <= 0 || o.n % 2 || o.port <= 0 || o.port > 255) {
		fprintf(stderr, "qp_scale: bad -n (a positive even count) or -i\n");
		return 2;
	}
	if (qp_open("qp_scale", &o, &d))
		return 1;
	qps = calloc(o.n, sizeof(*qps));
	pd = qps ? ibv_alloc_pd(d.ctx) : NULL;
	scq = pd ? ibv_create_cq(d.ctx, 4096, NULL, NULL, 0) : NULL;
	rcq = scq ? ibv_create_cq(d.ctx, 4096, NULL, NULL, 0) : NULL;
	if (!rcq) {
		fprintf(stderr, "qp_scale: PD or CQ creation failed\n");
		goto out_res;
	}

	rss0 = vm_rss();
	t0 = qp_now();
	if (setup(&o, &d, pd, scq, rcq, qps))
		goto out_qps;
	t1 = qp_now();
	rss1 = vm_rss();
	for (i = 0; i < o.n; i++) {
		err = ibv_destroy_qp(qps[i]);
		qps[i] = NULL;
		if (err) {
			fprintf(stderr, "qp_scale: ibv_destroy_qp failed: %s\n", strerror(err));
			goto out_qps;
		}
	}
	t2 = qp_now();
	printf("qp_scale: path=c qps=%d setup_s=%.6f teardown_s=%.6f rss_kib=%ld\n",
	       o.n, t1 - t0, t2 - t1, rss1 - rss0);
	ret = 0;

out_qps:
	destroy_all(qps, o.n);
out_res:
	free(qps);
	qp_release(pd, scq, rcq, &d);
	return ret;
}
