/*
 * core/launch/tcp_listen.h - the listening socket rank 0 (or node 0) opens
 * for the others: the rendezvous, the ledger exchange and the elastic
 * store all listen the same way.
 */
#ifndef DT_LAUNCH_TCP_LISTEN_H
#define DT_LAUNCH_TCP_LISTEN_H

/* Listen (non-blocking, close-on-exec, SO_REUSEADDR, backlog SOMAXCONN)
 * on port `port` (0: one the kernel picks) of the wildcard address of the
 * family `host` resolves to, so the others reach this node by any of its
 * addresses; IPv6 as dual stack, with IPv4 tried when IPv6 cannot be had
 * (no IPv6 socket, or a bind that fails other than EADDRINUSE).  The
 * socket, with the port bound in *bound (may be NULL); or -1 with errno
 * set. */
int dt_tcp_listen_any(const char *host, int port, int *bound);

#endif /* DT_LAUNCH_TCP_LISTEN_H */
