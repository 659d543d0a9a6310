/*
 * QP setup rate through plain libibverbs: the C side of the crate's
 * examples/perf_setup.rs, doing the same thing with the same options.
 *
 * N times: create an RC QP on one PD and CQ, move it RESET->INIT->RTR->RTS
 * (RTR to a second QP on the same device: loopback, GRH with GID index -x),
 * destroy it. Prints
 *   qp_setup: path=c qps=N seconds=S per_sec=R
 *
 * Build: cc -O2 .ci/bench/qp_setup.c -o qp_setup -libverbs  (qp_common.h
 * beside it holds the command line, the device and the QP transitions)
 * Usage: qp_setup [-d DEV] [-i PORT] [-x GIDIDX] [-n N]
 */
#include "qp_common.h"

static int fail(const char *what, int err)
{
	fprintf(stderr, "qp_setup: %s failed: %s\n", what, strerror(err));
	return 1;
}

/* Creates, connects and destroys o->n QPs with peer as their remote; 0 or 1. */
static int rounds(const struct qp_opts *o, const struct qp_dev *d,
		  struct ibv_pd *pd, struct ibv_cq *cq, struct ibv_qp *peer)
{
	const char *step;
	int i, err;

	for (i = 0; i < o->n; i++) {
		struct ibv_qp *qp = qp_new_rc(pd, cq, cq, 16);

		if (!qp) {
			fprintf(stderr, "qp_setup: ibv_create_qp failed (QP %d)\n", i);
			return 1;
		}
		if ((err = qp_to_rts(qp, o, d, peer->qp_num, &step))) {
			ibv_destroy_qp(qp);
			fprintf(stderr, "qp_setup: ibv_modify_qp %s failed: %s\n", step, strerror(err));
			return 1;
		}
		if ((err = ibv_destroy_qp(qp)))
			return fail("ibv_destroy_qp", err);
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct qp_opts o = {.dev_name = NULL, .port = 1, .gid_index = -1, .n = 200};
	struct qp_dev d;
	struct ibv_pd *pd = NULL;
	struct ibv_cq *cq = NULL;
	struct ibv_qp *peer = NULL;
	double t0, secs;
	int ret = 1;

	if (qp_parse(argc, argv, &o))
		return 2;
	if (o.n <= 0 || o.port <= 0 || o.port > 255) {
		fprintf(stderr, "qp_setup: bad -n or -i\n");
		return 2;
	}
	if (qp_open("qp_setup", &o, &d))
		return 1;
	pd = ibv_alloc_pd(d.ctx);
	cq = pd ? ibv_create_cq(d.ctx, 64, NULL, NULL, 0) : NULL;
	peer = cq ? qp_new_rc(pd, cq, cq, 16) : NULL;
	if (!peer) {
		fprintf(stderr, "qp_setup: PD, CQ or peer QP creation failed\n");
		goto out_res;
	}

	t0 = qp_now();
	if (rounds(&o, &d, pd, cq, peer))
		goto out_res;
	secs = qp_now() - t0;
	printf("qp_setup: path=c qps=%d seconds=%.6f per_sec=%.1f\n", o.n, secs,
	       secs > 0 ? o.n / secs : 0.0);
	ret = 0;

out_res:
	if (peer)
		ibv_destroy_qp(peer);
	qp_release(pd, cq, NULL, &d);
	return ret;
}
