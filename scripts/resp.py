"""The few RESP calls the memory measurement scripts (w8-layouts.py, w9-layouts.py)
make on one connection, with the standard library only: send a command, read a reply,
read `used_memory`."""
import socket


class Conn:
    """One connection to a redis-server on 127.0.0.1:PORT."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.rd = self.sock.makefile("rb")

    def send(self, *args):
        parts = [str(a).encode() if not isinstance(a, bytes) else a for a in args]
        self.sock.sendall(b"*%d\r\n" % len(parts)
                          + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts))

    def read(self):
        line = self.rd.readline()
        if line[:1] == b"$":
            n = int(line[1:])
            return self.rd.read(n + 2)[:-2] if n >= 0 else None
        if line[:1] == b"*":
            return [self.read() for _ in range(int(line[1:]))]
        return line

    def used(self):
        self.send("INFO", "memory")
        info = self.read().decode()
        return int(next(l for l in info.split("\r\n")
                        if l.startswith("used_memory:")).split(":")[1])
