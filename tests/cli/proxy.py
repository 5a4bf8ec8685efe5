#!/usr/bin/env python3
"""A TCP proxy for the CLI tests: proxy.py PORTFILE TARGET_PORT listens on a
free 127.0.0.1 port, writes it to PORTFILE and forwards every connection to
127.0.0.1:TARGET_PORT. Killing it (SIGKILL) cuts every client behind it off
from the server: their connections close and new ones are refused."""
import os
import selectors
import socket
import sys


def main():
    portfile, target = sys.argv[1], int(sys.argv[2])
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(64)
    tmp = portfile + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % ls.getsockname()[1])
    os.rename(tmp, portfile)
    sel = selectors.DefaultSelector()
    sel.register(ls, selectors.EVENT_READ, None)
    peer = {}

    def close(s):
        for x in (s, peer.pop(s, None)):
            if x is not None:
                peer.pop(x, None)
                try:
                    sel.unregister(x)
                except (KeyError, ValueError):
                    pass
                x.close()

    while True:
        for key, _ in sel.select():
            s = key.fileobj
            if s is ls:
                c, _ = ls.accept()
                u = socket.create_connection(("127.0.0.1", target))
                for x in (c, u):
                    x.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                peer[c], peer[u] = u, c
                sel.register(c, selectors.EVENT_READ, None)
                sel.register(u, selectors.EVENT_READ, None)
                continue
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            if not data or s not in peer:
                close(s)
                continue
            try:
                peer[s].sendall(data)
            except OSError:
                close(s)


main()
