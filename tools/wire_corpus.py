#!/usr/bin/env python3
"""Writes the seed corpora of the frame fuzzers (fuzz/corpus/wire_fuzz and
fuzz/corpus/connection_fuzz, the same seeds) in the wire format of
include/transport/quicksilver/transport/wire.h, version 2: 32-byte headers with the
payload's and the header's CRC32C. Standard library only.

    python3 tools/wire_corpus.py      # from the repository root
"""
import os
import struct

POLY = 0x82F63B78
TABLE = []
for b in range(256):
    c = b
    for _ in range(8):
        c = (c >> 1) ^ POLY if c & 1 else c >> 1
    TABLE.append(c)


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc = (crc >> 8) ^ TABLE[(crc ^ byte) & 0xFF]
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283

PUSH, PULL, ACK, HELLO, BYE, ERROR, HEARTBEAT = range(1, 8)


def frame(kind, sender=0, tensor=0, iteration=0, length=None, offset=0, priority=0, payload=b"", magic=0xC2):
    if length is None:
        length = len(payload)
    body = payload if kind != ACK else b""
    head = struct.pack("<BBHIII", magic, kind | 0x80, sender, tensor, iteration, length)
    head += offset.to_bytes(6, "little") + struct.pack("<HI", priority, crc32c(body))
    return head + struct.pack("<I", crc32c(head)) + payload


hello = struct.pack("<IIQQ", 4, 2, 0x1234, 0x5678)
seeds = {
    "hello_push_ack_bye": frame(HELLO, sender=1, payload=hello)
    + frame(PUSH, sender=1, iteration=1, offset=64, priority=1, payload=bytes(range(16)))
    + frame(ACK, iteration=1, length=16, offset=64)
    + frame(HEARTBEAT, sender=1)
    + frame(BYE),
    "pull_then_error": frame(PULL, sender=1, iteration=1, payload=b"\x02" * 32) + frame(ERROR, payload=b"bad request"),
    "push_tensor1": 2 * frame(PUSH, sender=2, tensor=1, iteration=2, offset=8, priority=3, payload=b"\x01" * 8),
    "bad_magic": frame(PUSH, sender=1, iteration=1, offset=64, priority=1, payload=bytes(range(16)), magic=0x51),
    "truncated_payload": frame(PUSH, sender=1, iteration=1, offset=64, priority=1, payload=bytes(range(16)))[:46],
}
# A corrupted payload: one bit of the push flipped after it was sealed; the header's last
# byte 0xEE tells the fuzzers' sealing (fuzz/seal.h) to keep the payload's checksum.
bad = bytearray(frame(PUSH, sender=1, iteration=1, offset=64, priority=1, payload=bytes(range(16))))
bad[40] ^= 0x10
bad[31] = 0xEE
seeds["corrupted_payload"] = bytes(bad)

for target in ("wire_fuzz", "connection_fuzz"):
    folder = os.path.join("fuzz", "corpus", target)
    for name in os.listdir(folder):
        os.remove(os.path.join(folder, name))
    for name, data in seeds.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
print("wrote", len(seeds), "seeds to fuzz/corpus/{wire_fuzz,connection_fuzz}")
