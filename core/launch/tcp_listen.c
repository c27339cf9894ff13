/*
 * core/launch/tcp_listen.c - rank 0's listening socket (tcp_listen.h).
 */
#include "launch/tcp_listen.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int dt_tcp_listen_any(const char *host, int port, int *bound)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    int family = AF_INET6;
    if (getaddrinfo(host, NULL, &hints, &res) == 0 && res) {
        family = res->ai_family;
        freeaddrinfo(res);
    }
    int fams[2] = {family, family == AF_INET6 ? AF_INET : -1};
    int err = 0;
    for (int i = 0; i < 2 && fams[i] >= 0; i++) {
        int fd = socket(fams[i], SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1, zero = 0;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        struct sockaddr_storage ss;
        memset(&ss, 0, sizeof ss);
        socklen_t sl;
        if (fams[i] == AF_INET6) {
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
            a->sin6_family = AF_INET6;
            a->sin6_addr = in6addr_any;
            a->sin6_port = htons((uint16_t)port);
            sl = sizeof *a;
        } else {
            struct sockaddr_in *a = (struct sockaddr_in *)&ss;
            a->sin_family = AF_INET;
            a->sin_addr.s_addr = htonl(INADDR_ANY);
            a->sin_port = htons((uint16_t)port);
            sl = sizeof *a;
        }
        if (bind(fd, (struct sockaddr *)&ss, sl) == 0 && listen(fd, SOMAXCONN) == 0) {
            sl = sizeof ss;
            if (bound && getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
                *bound = ntohs(ss.ss_family == AF_INET6
                                   ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                   : ((struct sockaddr_in *)&ss)->sin_port);
            else if (bound)
                *bound = port;
            return fd;
        }
        err = errno;
        close(fd);
        if (err == EADDRINUSE)
            break;
    }
    errno = err;
    return -1;
}
