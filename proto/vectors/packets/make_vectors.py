"""Regenerate the packet golden files from the cases below (run from the repo root).

    python proto/vectors/packets/make_vectors.py

The golden files are a contract other implementations are tested against: review every
byte of the diff this produces, and bump the packet version if an existing case changes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from triplane.proto import packet as pk

HERE = Path(__file__).parent
SECRET = "triplane-test-secret-NOT-FOR-PRODUCTION"  # TEST ONLY: never use it in a cluster
NOW = 1732212340.0

TASKS: dict[str, pk.TaskPacket] = {
    "task_matmul": pk.TaskPacket(
        task="j42.t17.a0", op="matmul", inputs=("j42.x.0.1", "j42.w.1.0"), outputs=("j42.t17",),
        deadline=1732212345.12, pull_from={"j42.w.1.0": "n2"}, attrs={}, to="n1", t=1732212340.25),
    "task_creation_no_inputs": pk.TaskPacket(
        task="j42.t3.a2", op="normal", inputs=(), outputs=("j42.w.0.0", "j42.w.0.1"),
        deadline=1732212400.0, attrs={"seed": 7, "std": 0.05, "shape": [784, 10], "dtype": "float32"},
        to="n1", t=1732212340.0),
    "task_yaml_pitfalls": pk.TaskPacket(
        task="j-9f2c.fused_3.a1", op="fused:add+relu", inputs=("j-9f2c.a.0",), outputs=("j-9f2c.b.0",),
        deadline=1732212345.0,
        attrs={
            "big": 1e16, "small": 1e-05, "tiny": 5e-324, "huge": 1.7976931348623157e308,
            "neg_zero": -0.0, "neg": -12, "int64_max": 2**63 - 1, "flag": True, "none": None,
            "yaml_words": ["yes", "no", "on", "off", "y", "n", "null", "~", "true"],
            "number_like": ["1e5", "0x1F", "012", "1_000", "1:30", ".inf", "2001-12-14", "-"],
            "syntax_like": ["- a", "a: b", "#c", "[x]", "{y}", "&a", "*a", "!t", "|", ">", "%", "@", "`"],
            "escapes": ["quote\" back\\ slash/", "tab\tnl\ncr\r", "nul\x00bel\x07del\x7f",
                        "nel\x85 ls\u2028 ps\u2029 bom\ufeff nonchar\uffff"],
            "unicode": ["h\u00e9llo", "\u2603", "\U0001f600", "\u4e2d\u6587"],
            "nested": {"list": [[1, 2.5], {"k": []}], "empty": {}},
            " spaced key ": "  spaced value  ",
        },
        to="host-1.example:n/1", t=1732212339.5),
    # A tiny job as one grouped task (proto/packet.md, "Grouped tasks"): its plan in one
    # string attribute; slots 0-1 are the inputs, 2.. the nodes' values.
    "task_group": pk.TaskPacket(
        task="j42.g.a0", op="graph", inputs=("u-" + "0" * 32, "u-" + "1" * 32), outputs=("j42.n4", "j42.n3"),
        deadline=1732212345.0, pull_from={"u-" + "0" * 32: "scheduler", "u-" + "1" * 32: "scheduler"},
        attrs={"program": '{"in":[[[64,3],"float32"],[[3,2],"float32"]],"nodes":[["n2","matmul",[0,1],{}],'
                          '["n3","tanh",[2],{}],["n4","sum",[3],{"axes":null,"keepdims":false}]],'
                          '"out":[4,3],"v":1}'},
        to="n1", t=1732212340.0),
    # A grouped task carrying one small upload's value (proto/packet.md, "Carried values"):
    # float32 [2, 2] = [[1, 2], [3, 4]]; the other input is pulled.
    "task_carried": pk.TaskPacket(
        task="j42.g.a0", op="graph", inputs=("u-" + "2" * 32, "u-" + "3" * 32), outputs=("j42.n3",),
        deadline=1732212345.0, pull_from={"u-" + "3" * 32: "scheduler"},
        attrs={"program": '{"in":[[[2,2],"float32"],[[2,2],"float32"]],"nodes":[["n3","add",[0,1],{}]],'
                          '"out":[2],"v":1}'},
        to="n1", t=1732212340.0,
        data={"u-" + "2" * 32: pk.Carried((2, 2), "float32",
                                          bytes.fromhex("0000803f000000400000404000008040"))}),
}
REPLIES: dict[str, pk.Reply] = {
    # A grouped task's reply carrying its smallest output's value (float32 10.0).
    "reply_carried": pk.Reply(
        task="j42.g.a0", ok=True, timings=pk.Timings(1732212341.5, 1732212341.501, 1732212341.75),
        outputs=(pk.TileInfo("j42.n3", (2, 2), "float32", 16), pk.TileInfo("j42.n4", (), "float32", 4)),
        data={"j42.n4": pk.Carried((), "float32", bytes.fromhex("00002041"))}),
    "reply_ok": pk.Reply(
        task="j42.t17.a0", ok=True, timings=pk.Timings(1732212341.5, 1732212341.501, 1732212341.75),
        outputs=(pk.TileInfo("j42.t17", (64, 10), "float32", 2560),)),
    "reply_user_error": pk.Reply(
        task="j42.t18.a0", ok=False, timings=pk.Timings(1732212341.5, 1732212341.5, 1732212341.5),
        error=pk.TaskError("user", "matmul: inner dimensions differ: (64, 784) @ (10, 784)")),
    "reply_infra_error": pk.Reply(
        task="j42.t19.a1", ok=False, timings=pk.Timings(1732212341.0, 0.0, 0.0),
        error=pk.TaskError("infra", "memory engine 'host' is full (8 GiB)")),
    "reply_pull_error": pk.Reply(
        task="j42.t17.a2", ok=False, timings=pk.Timings(1732212342.0, 1732212342.0, 1732212342.25),
        error=pk.TaskError("infra", "pulling input j42.w.1.0 from node n2 failed: connection refused",
                           node="n2", input="j42.w.1.0")),
    "reply_group_error": pk.Reply(
        task="j42.g.a0", ok=False, timings=pk.Timings(1732212341.5, 1732212341.5, 1732212341.5),
        error=pk.TaskError("user", "gather: index 7 at position 1 is out of range for an axis of size 3",
                           node="n1", at="n5")),
}
CONTROLS: dict[str, pk.Control] = {
    "control_ping": pk.Control("ping", "n1-000042", 1732212340.25),
    "control_ack": pk.Control("ack", "j42.t17.a0", 1732212341.5),
    "control_ack_running": pk.Control("ack", "j42.t17.a0", 1732212344.5, since=1732212341.625),
}


def wire(m: Any) -> dict[str, Any]:
    """The signed fields of ``m`` as they appear on the wire (the packet minus ``sig``)."""
    d = yaml.safe_load(pk.encode(m, SECRET.encode()))
    del d["sig"]
    return d


def main() -> None:
    secret = SECRET.encode()
    cases: list[dict[str, Any]] = []
    for name, m in {**TASKS, **REPLIES, **CONTROLS}.items():
        data = pk.encode(m, secret)
        (HERE / f"{name}.packet").write_bytes(data)
        kind = "task" if name.startswith("task") else "reply" if name.startswith("reply") else "control"
        cases.append({"name": name, "kind": kind, "file": f"{name}.packet", "expect": "ok",
                      "message": wire(m)})

    base = pk.encode(TASKS["task_matmul"], secret)
    body = base[:-74] + b"}"  # the signed bytes

    def signed(b: bytes) -> bytes:  # passes the signature check: what follows it is tested
        return b[:-1] + b',"sig":"' + pk.sign(b, secret).encode() + b'"}'

    # Block style, as a person (or yaml.safe_dump) writes it: refused unread, since the
    # signature is checked over the bytes before any parsing and this text has no
    # trailing sig member (proto/packet.md, "Reading a packet").
    block = (b"# a task packet in block style\nv: 2\ntask: j42.t17.a0\nop: matmul\n"
             b"in: [j42.x.0.1, j42.w.1.0]\nout:\n  - j42.t17\nfrom: {j42.w.1.0: n2}\nattrs: {}\n"
             b"deadline: 1732212345.120\nto: n1\nt: 1732212340.25\nsig: " + base[-66:-2] + b"\n")
    stale = pk.encode(TASKS["task_matmul"]._replace(t=NOW - 31), secret)
    rejects = {
        "reject_block_yaml": (block, "unsigned"),
        "reject_bad_signature": (base.replace(b'"op":"matmul"', b'"op":"matadd"'), "bad_signature"),
        "reject_other_node": (base.replace(b'"to":"n1"', b'"to":"n3"'), "bad_signature"),
        "reject_wrong_secret": (pk.encode(TASKS["task_matmul"], b"another-secret-of-enough-bytes"),
                                "bad_signature"),
        "reject_unsigned": (body, "unsigned"),
        "reject_version_1": (signed(body.replace(b'"v":2', b'"v":1')), "version"),
        "reject_duplicate_key": (base.replace(b'{"attrs":{}', b'{"op":"rm -rf","attrs":{}'),
                                 "bad_signature"),
        "reject_unknown_field": (signed(body.replace(b'{"attrs"', b'{"x":1,"attrs"')), "invalid"),
        "reject_signed_not_json": (signed(b'{"a":[1,2}'), "malformed"),
        "reject_stale_sent": (stale, "stale"),
        "reject_alias": (b"v: 2\ntask: j42.t17.a0\nop: &o matmul\nin: [*o]\n", "unsigned"),
        "reject_not_yaml": (b"\x00\xff{garbage", "unsigned"),
        "reject_oversized_datagram": (b"{" + b" " * 1472 + b"}", "oversized"),
    }
    for name, (data, expect) in rejects.items():
        (HERE / f"{name}.packet").write_bytes(data)
        cases.append({"name": name, "kind": "task", "file": f"{name}.packet", "expect": expect})

    index = {
        "about": "Golden task packets (proto/packet.md). Decode each file with the secret at time "
                 "'now' and max_bytes 1472: 'expect' is 'ok' (and 'message' the signed fields) or "
                 "the drop reason. Encoding each 'ok' message with the secret must give the file's "
                 "bytes exactly.",
        "secret": SECRET,
        "secret_note": "TEST ONLY. The HMAC key is the UTF-8 bytes of 'secret'.",
        "now": NOW,
        "cases": cases,
    }
    (HERE / "cases.json").write_text(json.dumps(index, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
