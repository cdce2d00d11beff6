"""Task packet codec throughput: triplane's codec against YAML, JSON and msgpack.

    python bench/packet_codec.py [--seconds 1.0]

One typical task packet (~300 bytes on the wire), encoded then decoded in a loop on one
core; each row prints encode+decode round trips per second and microseconds per round trip
(best of three runs). The triplane row does strictly more work than the others: it
validates every field both ways, signs (HMAC-SHA256) and verifies, and checks staleness.
The target (issue 3) is 20,000 round trips per second.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import yaml

from triplane.proto import packet as pk
from triplane.proto.packet.schema import task_to_wire

SECRET = b"bench-secret-not-for-production"
PACKET = pk.TaskPacket(
    task="j42.t17.a0", op="matmul", inputs=("j42.x.0.1", "j42.w.1.0"), outputs=("j42.t17.0.1",),
    deadline=1732212345.12, pull_from={"j42.w.1.0": "n2"},
    attrs={"transpose_a": False, "transpose_b": True, "alpha": 1.0, "tile": [0, 1], "engine": "numpy"},
    to="n1", t=1732212344.12)
NOW = PACKET.deadline - 1.0


def best_rate(roundtrip: Callable[[], Any], seconds: float) -> float:
    """Round trips per second: the best of three runs of about ``seconds / 3`` each."""
    roundtrip()
    best = 0.0
    for _ in range(3):
        n, start = 0, time.perf_counter()
        deadline = start + seconds / 3
        while True:
            for _ in range(200):
                roundtrip()
            n += 200
            now = time.perf_counter()
            if now >= deadline:
                break
        best = max(best, n / (now - start))
    return best


def rows() -> list[tuple[str, Callable[[], Any] | None, str]]:
    wire = {**task_to_wire(PACKET), "sig": "0" * 64}
    out: list[tuple[str, Callable[[], Any] | None, str]] = [
        ("triplane codec (validate+sign+verify)",
         lambda: pk.decode_task(pk.encode_task(PACKET, SECRET), SECRET, now=NOW), ""),
    ]
    if getattr(yaml, "__with_libyaml__", False):
        out.append(("PyYAML C dumper + C safe loader",
                    lambda: yaml.load(yaml.dump(wire, Dumper=yaml.CSafeDumper), Loader=yaml.CSafeLoader), ""))
    else:
        out.append(("PyYAML C dumper + C safe loader", None, "PyYAML built without libyaml"))
    out.append(("PyYAML pure-Python safe_dump + safe_load",
                lambda: yaml.load(yaml.dump(wire, Dumper=yaml.SafeDumper), Loader=yaml.SafeLoader), ""))
    import json

    out.append(("json dumps + loads (stdlib)", lambda: json.loads(json.dumps(wire)), ""))
    try:
        import orjson

        out.append(("orjson dumps + loads", lambda: orjson.loads(orjson.dumps(wire)), ""))
    except ImportError:
        out.append(("orjson dumps + loads", None, "orjson not installed (pip install orjson)"))
    try:
        import msgpack

        out.append(("msgpack packb + unpackb", lambda: msgpack.unpackb(msgpack.packb(wire)), ""))
    except ImportError:
        out.append(("msgpack packb + unpackb", None, "msgpack not installed (pip install msgpack)"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="time per row (default 1.5)")
    args = parser.parse_args()
    data = pk.encode_task(PACKET, SECRET)
    assert pk.decode_task(data, SECRET, now=NOW) == PACKET
    # The split of the codec's own time, to see where it goes.
    enc = best_rate(lambda: pk.encode_task(PACKET, SECRET), args.seconds)
    dec = best_rate(lambda: pk.decode_task(data, SECRET, now=NOW), args.seconds)
    print(f"packet: {len(data)} bytes on the wire; codec encode {1e6 / enc:.1f} us, "
          f"decode {1e6 / dec:.1f} us\n")
    print(f"| {'codec':<42} | {'round trips/s':>13} | {'us/round trip':>13} |")
    print(f"|{'-' * 44}|{'-' * 14}:|{'-' * 14}:|")
    for name, fn, note in rows():
        if fn is None:
            print(f"| {name:<42} | {'skipped':>13} | {note} |")
            continue
        rate = best_rate(fn, args.seconds)
        print(f"| {name:<42} | {rate:>13,.0f} | {1e6 / rate:>13.1f} |")
    print("\ntarget: >= 20,000 round trips/s for the triplane codec on one core")


if __name__ == "__main__":
    main()
