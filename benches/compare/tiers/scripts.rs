//! The shell and C every tool's steps run on the hosts of the three-tier workload.

// The host's side is kept cheap (shell builtins wherever one does, no program started per
// poll): every "host" shares the controller's two cores, and CPU the hosts burn slows every
// tool alike and hides what the benchmark is for, the order each tool starts the work in.

/// `/srv/tier/step STEP VERSION SERVICE [POOL]`: the steps every tool runs (POSIX sh). The
/// host's address is read from `/srv/tier/address`, so that a step's text is the same on every
/// host of a tier: pyinfra makes one operation of a call only when its arguments are the same
/// on every host, and with per-host text it ran one operation per host, the tiers interleaved.
pub(super) const STEP_SCRIPT: &str = r#"#!/bin/sh
# step STEP VERSION SERVICE [POOL]: one step of the three-tier upgrade.
step=$1 version=$2 svc=$3 pool=${4-}
d=/srv/$svc
read -r install ready </srv/tier/wait || exit 1
read -r addr </srv/tier/address || exit 1
case $step in
stop)
    pid=
    read -r pid <"$d/pid" 2>/dev/null
    [ -n "$pid" ] || exit 0
    kill "$pid" 2>/dev/null
    while kill -0 "$pid" 2>/dev/null; do sleep 0.01; done
    : >"$d/pid" ;;
install)
    # A download: a wait, then the version in place (and web's pool).
    sleep "$install" || exit 1
    printf '%s\n' "$version" >"$d/version" || exit 1
    if [ -n "$pool" ]; then printf '%s\n' $pool >"$d/upstreams" || exit 1; fi ;;
start)
    # The server listens only once ready: it waits, then binds the port.
    setsid /srv/tier/serve "$addr" 8000 "$d" "$ready" >"$d/server.log" 2>&1 </dev/null &
    echo $! >"$d/pid" ;;
check)
    exec bash /srv/tier/check "$addr" "$version" ;;
*)
    echo "step: unknown step $step" >&2; exit 2 ;;
esac
"#;

/// `/srv/tier/check ADDR VERSION`: polls the real port until it serves the version (60 s at
/// most): bash, for `/dev/tcp` and a `read -t` on a FIFO nobody writes as its sleep, so that a
/// poll starts no program.
pub(super) const CHECK_SCRIPT: &str = r#"#!/bin/bash
addr=$1 version=$2
exec 9<>/srv/tier/fifo
for ((i = 0; i < 1200; i++)); do
    if { exec 3<>"/dev/tcp/$addr/8000"; } 2>/dev/null; then
        printf 'GET /version HTTP/1.0\r\n\r\n' >&3
        last=
        while IFS= read -r line <&3 || [ -n "$line" ]; do last=$line; line=; done
        exec 3>&-
        [ "$last" = "$version" ] && exit 0
    fi
    read -r -t 0.05 -u 9 _
done
echo "not serving $version on $addr:8000" >&2
exit 1
"#;

/// `/srv/tier/serve ADDR PORT DIR READY`: waits READY seconds, then answers every request with
/// DIR/version (HTTP/1.0). C, compiled once by the driver (`cc`, which cargo needs anyway):
/// it starts in about a millisecond where Python takes 28 ms of CPU and Perl 18 ms on this
/// machine, which 200 hosts starting at once would pay on the controller's two cores.
pub(super) const SERVE_C: &str = r#"#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 5) { fputs("usage: serve ADDR PORT DIR READY\n", stderr); return 2; }
    char path[4096], body[256], head[160], buf[4096];
    snprintf(path, sizeof path, "%s/version", argv[3]);
    int fd = open(path, O_RDONLY);
    if (fd < 0) { perror(path); return 1; }
    ssize_t n = read(fd, body, sizeof body);
    close(fd);
    if (n < 0) { perror(path); return 1; }
    double ready = atof(argv[4]);
    struct timespec ts = { (time_t)ready, (long)((ready - (double)(time_t)ready) * 1e9) };
    nanosleep(&ts, NULL);
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = { 0 };
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)atoi(argv[2]));
    if (inet_pton(AF_INET, argv[1], &a.sin_addr) != 1) { fputs("bad address\n", stderr); return 2; }
    if (bind(s, (struct sockaddr *)&a, sizeof a) != 0 || listen(s, 128) != 0) { perror("bind"); return 1; }
    int h = snprintf(head, sizeof head,
        "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n", (int)n);
    struct timeval tv = { 2, 0 };
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0) continue;
        setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        if (read(c, buf, sizeof buf) >= 0 && write(c, head, h) == h) (void)!write(c, body, n);
        close(c);
    }
}
"#;
