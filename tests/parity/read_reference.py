#!/usr/bin/env python3
"""read_reference.py -- prints a parity reference file (see README.md), or compares two.

  python3 tests/parity/read_reference.py tests/parity/tiny_ref.bin
  python3 tests/parity/read_reference.py A.bin B.bin   # max |a-b| / max|b| per section
Needs only the Python standard library.
"""
import struct
import sys


def read(path):
    with open(path, "rb") as f:
        b = f.read()
    off = 0

    def take(fmt):
        nonlocal off
        v = struct.unpack_from("<" + fmt, b, off)
        off += struct.calcsize("<" + fmt)
        return v

    if b[:8] != b"MOECREF\0":
        sys.exit(f"{path}: not a moec parity reference (bad magic)")
    off = 8
    version, B, S, V, n = take("5I")
    if version != 1:
        sys.exit(f"{path}: version {version}, this reader knows 1")
    r = {"B": B, "S": S, "V": V, "steps": n}
    r["tokens"] = take(f"{B * S}i")
    r["labels"] = take(f"{B * S}i")
    r["losses"] = take(f"{n}f")
    r["grad_norms"] = take(f"{n}f")
    rows = min(4, B * S)
    r["logits"] = take(f"{rows * V}f")
    for sec in ("grads", "final"):
        (count,) = take("I")
        d = {}
        for _ in range(count):
            (ln,) = take("I")
            name = b[off:off + ln].decode()
            off += ln
            (nd,) = take("I")
            dims = take(f"{nd}I")
            numel = 1
            for x in dims:
                numel *= x
            d[name] = (dims, take(f"{numel}f"))
        r[sec] = d
    if off != len(b):
        sys.exit(f"{path}: {len(b) - off} trailing bytes")
    return r


def rel(a, b):
    m = max((abs(x) for x in b), default=0.0)
    e = max((abs(x - y) for x, y in zip(a, b)), default=0.0)
    return e / m if m else e


def main():
    if len(sys.argv) == 2:
        r = read(sys.argv[1])
        print(f"B {r['B']} S {r['S']} V {r['V']} steps {r['steps']}")
        print("tokens[0]:", bytes(t for t in r["tokens"][: r["S"]]).decode("ascii", "replace"))
        print("masked labels:", sum(1 for x in r["labels"] if x < 0))
        print("losses:", " ".join(f"{x:.7f}" for x in r["losses"]))
        print("grad norms:", " ".join(f"{x:.7f}" for x in r["grad_norms"]))
        for name, (dims, v) in r["grads"].items():
            print(f"grad {name} {list(dims)} max|g| {max(abs(x) for x in v):.3e}")
        print(f"{len(r['final'])} final weights")
    elif len(sys.argv) == 3:
        a, b = read(sys.argv[1]), read(sys.argv[2])
        if a["tokens"] != b["tokens"] or a["labels"] != b["labels"]:
            print("tokens or labels differ")
        print("losses:", [f"{(x - y) / y:+.2e}" for x, y in zip(a["losses"], b["losses"])])
        print("grad norms:", [f"{(x - y) / y:+.2e}" for x, y in zip(a["grad_norms"], b["grad_norms"])])
        print(f"logits: {rel(a['logits'], b['logits']):.2e}")
        for sec in ("grads", "final"):
            worst = max((rel(a[sec][n][1], b[sec][n][1]), n) for n in b[sec])
            print(f"{sec}: worst {worst[0]:.2e} ({worst[1]})")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
