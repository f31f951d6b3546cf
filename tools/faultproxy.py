#!/usr/bin/env python3
"""A fault-injecting TCP proxy (issue 15, point 7; docs/reliability.md "Faults on the wire").

This kernel has no netem, so the faults a link can have are made in user space, between
two peers: the client connects to the proxy, which connects to --target and forwards both
ways, and at a chosen moment (a byte count in one direction) does one of

  delay    every chunk waits MS milliseconds each way (a delay line; always on)
  stall    stop forwarding both ways for --stall-for seconds, then go on (a link that
           stops carrying packets, or a peer that hangs; the sockets stay open)
  cut      close both sides (a peer or a middlebox that drops the connection)
  corrupt  flip one bit in each of --corrupt-count bytes, --corrupt-every bytes apart,
           from that byte on: the bytes leave the proxy under a fresh, valid TCP
           checksum, which is what corruption above TCP looks like (a middlebox, a NIC
           offload, memory)

The fault happens once, on the first connection whose --direction ("up": client to target,
"down": target to client) reaches --after bytes; other connections are forwarded as they
are. Standard library only (any python3).

    faultproxy.py --listen 127.0.0.1:0 --target 127.0.0.1:7100 --fault stall --after 3000000 \\
                  --stall-for 10

--target-file FILE instead of --target: the target is read from FILE (one line,
HOST:PORT) when the first connection comes, waiting up to 30 s for it to appear; for a
peer whose address is known only once the proxy's own address was handed out (a gloo
pair: tests/fault_test.sh).

prints "listening HOST:PORT" on stdout once it accepts connections, and one line on stderr
per connection and per fault ("fault: stall of up at byte 3000000 for 10 s"). It runs until
it is killed.
"""
import argparse
import queue
import socket
import sys
import threading
import time


def endpoint(text):
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError("'%s' is not HOST:PORT" % text)
    return host, int(port)


def log(msg):
    sys.stderr.write("faultproxy %.3f: %s\n" % (time.time(), msg))  # wall clock: comparable with date +%s.%N
    sys.stderr.flush()


class Fault:
    """The one fault of this proxy, shared by its connections."""

    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.fired = False
        self.stall_until = 0.0

    def take(self):
        """True for the one caller that fires the fault."""
        with self.lock:
            if self.fired or self.args.fault == "none":
                return False
            self.fired = True
            return True


class Link:
    """One proxied connection: two directions, each a reader thread and a writer thread
    joined by a queue (the delay line)."""

    def __init__(self, client, fault, args, number):
        self.client = client
        self.fault = fault
        self.args = args
        self.number = number
        self.closed = threading.Event()
        self.server = socket.create_connection(target(args))
        for s in (self.client, self.server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def start(self):
        for name, src, dst in (("up", self.client, self.server), ("down", self.server, self.client)):
            q = queue.Queue()
            threading.Thread(target=self.read, args=(name, src, q), daemon=True).start()
            threading.Thread(target=self.write, args=(name, dst, q), daemon=True).start()

    def close(self, why):
        if self.closed.is_set():
            return
        self.closed.set()
        log("connection %d closed: %s" % (self.number, why))
        for s in (self.client, self.server):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def wait_out_stall(self):
        while not self.closed.is_set() and time.monotonic() < self.fault.stall_until:
            time.sleep(0.01)

    def read(self, name, src, q):
        a = self.args
        seen = 0  # bytes of this direction so far
        corrupt_next = None  # stream offset of the next byte to flip
        corrupt_left = 0
        while not self.closed.is_set():
            self.wait_out_stall()
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                q.put(None)
                return
            start, seen = seen, seen + len(data)
            if name == a.direction and start <= a.after < seen and self.fault.take():
                if a.fault == "stall":
                    log("fault: stall of %s at byte %d for %g s" % (name, a.after, a.stall_for))
                    self.fault.stall_until = time.monotonic() + a.stall_for
                elif a.fault == "cut":
                    log("fault: cut of %s at byte %d" % (name, a.after))
                    cut = a.after - start
                    if cut > 0:
                        q.put((time.monotonic() + a.delay / 1000.0, data[:cut]))
                    q.put("cut")
                    return
                elif a.fault == "corrupt":
                    log("fault: corrupt %d byte(s) of %s from byte %d, every %d" %
                        (a.corrupt_count, name, a.after, a.corrupt_every))
                    corrupt_next, corrupt_left = a.after, a.corrupt_count
            if corrupt_left > 0 and corrupt_next < seen:
                buf = bytearray(data)
                while corrupt_left > 0 and corrupt_next < seen:
                    buf[corrupt_next - start] ^= 0x10
                    corrupt_next += a.corrupt_every
                    corrupt_left -= 1
                data = bytes(buf)
            q.put((time.monotonic() + a.delay / 1000.0, data))

    def write(self, name, dst, q):
        while True:
            item = q.get()
            if item is None:  # the other side closed: pass the end on
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            if item == "cut":
                self.close("cut")
                return
            due, data = item
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            self.wait_out_stall()
            try:
                dst.sendall(data)
            except OSError as e:
                self.close("%s: %s" % (name, e))
                return


def target(args):
    """--target, or the address in --target-file once it is there."""
    if args.target is not None:
        return args.target
    deadline = time.time() + 30
    while True:
        try:
            with open(args.target_file) as f:
                text = f.read().strip()
            if text:
                return endpoint(text)
        except (OSError, argparse.ArgumentTypeError):
            pass
        if time.time() > deadline:
            raise OSError("no address in %s after 30 s" % args.target_file)
        time.sleep(0.02)


def main():
    p = argparse.ArgumentParser(description="Fault-injecting TCP proxy (delay, stall, cut, corrupt)")
    p.add_argument("--listen", type=endpoint, default=("127.0.0.1", 0), help="HOST:PORT (port 0: ephemeral)")
    to = p.add_mutually_exclusive_group(required=True)
    to.add_argument("--target", type=endpoint, help="HOST:PORT to forward to")
    to.add_argument("--target-file", help="a file that will hold HOST:PORT to forward to (read at the first connection)")
    p.add_argument("--delay", type=float, default=0.0, help="milliseconds every chunk waits, each way")
    p.add_argument("--fault", choices=["none", "stall", "cut", "corrupt"], default="none")
    p.add_argument("--after", type=int, default=0, help="the fault happens at this byte of --direction")
    p.add_argument("--direction", choices=["up", "down"], default="up",
                   help="up: client to target; down: target to client")
    p.add_argument("--stall-for", type=float, default=10.0, help="stall: seconds")
    p.add_argument("--corrupt-count", type=int, default=1, help="corrupt: bytes to flip")
    p.add_argument("--corrupt-every", type=int, default=4096, help="corrupt: bytes between flipped bytes")
    a = p.parse_args()
    if a.delay < 0 or a.after < 0 or a.stall_for < 0 or a.corrupt_count < 1 or a.corrupt_every < 1:
        p.error("--delay, --after, --stall-for must be >= 0; --corrupt-count, --corrupt-every >= 1")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(a.listen)
    listener.listen(64)
    host, port = listener.getsockname()
    print("listening %s:%d" % (host, port), flush=True)
    fault = Fault(a)
    number = 0
    while True:
        client, peer = listener.accept()
        number += 1
        try:
            link = Link(client, fault, a, number)
        except OSError as e:
            log("connection %d from %s:%d: cannot reach the target: %s" % (number, peer[0], peer[1], e))
            client.close()
            continue
        log("connection %d from %s:%d" % (number, peer[0], peer[1]))
        link.start()


if __name__ == "__main__":
    main()
