/*
 * The one header bindgen reads. Everything in `rdma_verbs::sys` comes from
 * here; the `static inline` functions of these headers are also compiled
 * into C wrappers (see build.rs).
 */
#include <infiniband/verbs.h>

/* librdmacm, with the `cm` feature (on by default): build.rs defines this. */
#ifdef RDMA_VERBS_CM
#include <rdma/rdma_cma.h>
#endif

/*
 * verbs_api.h defines a few IBV_ constants as other enums' constants
 * (`#define IBV_QPF_GRH_REQUIRED IB_UVERBS_QPF_GRH_REQUIRED`), which bindgen
 * cannot evaluate. An enum gives them values bindgen can read; they appear
 * in `sys` under these names.
 */
enum {
	RDMA_VERBS_IBV_QPF_GRH_REQUIRED = IBV_QPF_GRH_REQUIRED,
	RDMA_VERBS_IBV_ACCESS_OPTIONAL_RANGE = IBV_ACCESS_OPTIONAL_RANGE,
};
