"""Writes tests/unit/ck_parity.bin: inputs and PyTorch / Hugging Face transformers results that
test_ck_parity.c checks the CPU reference kernels against, so the parity check itself runs
without torch.

Usage (on a machine with torch and transformers; CPU is enough):
    python3 tests/unit/ck_parity_gen.py tests/unit/ck_parity.bin

File format (little endian): magic b"MOECKPAR", u32 version (1), u32 count, then count entries:
name (48 bytes, NUL padded), u32 dtype (0 f32, 1 i32, 2 u8, 3 u16, 4 u32, 5 text), u32 0,
i64 n (elements), n elements.
"""
import math
import struct
import sys

import torch
import torch.nn.functional as F

torch.manual_seed(20260101)
entries = []
CODES = {"f32": (0, "f"), "i32": (1, "i"), "u8": (2, "B"), "u16": (3, "H"), "u32": (4, "I")}


def put(name, values, kind="f32"):
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().contiguous().flatten().tolist()
    code, fmt = CODES[kind]
    entries.append((name, code, len(values), struct.pack("<%d%s" % (len(values), fmt), *values)))


def put_text(name, text):
    data = text.encode()
    entries.append((name, 5, len(data), data))


def section(name, fn):
    try:
        fn()
        print("ok  ", name)
    except Exception as e:  # a section that does not run here is left out, and the test says so
        print("SKIP", name, ":", type(e).__name__, e)


import transformers  # noqa: E402

put_text("versions", "torch %s, transformers %s" % (torch.__version__, transformers.__version__))
mix = None
try:
    import transformers.models.mixtral.modeling_mixtral as mix
except Exception as e:
    print("no transformers Mixtral module:", e)


def adamw():
    n, steps = 256, 5
    p0 = torch.randn(n)
    grads = [torch.randn(n) * s for s in (1.0, 0.1, 3.0, 1e-4, 1.0)]
    for g in grads:
        g[0] = 1e-7  # eps matters
    p = torch.nn.Parameter(p0.clone())
    opt = torch.optim.AdamW([p], lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            foreach=False)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    st = opt.state[p]
    put("adamw.p0", p0), put("adamw.g", torch.stack(grads))
    put("adamw.p", p), put("adamw.m", st["exp_avg"]), put("adamw.v", st["exp_avg_sq"])
    # two groups (decay / no decay), clipped to a global norm of 1
    pa, pb = torch.nn.Parameter(p0.clone()), torch.nn.Parameter(torch.rand(12) + 0.5)
    put("adamw_clip.pb0", pb)
    opt = torch.optim.AdamW([{"params": [pa], "weight_decay": 0.1},
                             {"params": [pb], "weight_decay": 0.0}],
                            lr=1e-2, betas=(0.8, 0.999), eps=1e-6, foreach=False)
    ga, gb, norms = [], [], []
    for s in range(steps):
        ga.append(torch.randn(n) * 0.2), gb.append(torch.randn(12))
        pa.grad, pb.grad = ga[-1].clone(), gb[-1].clone()
        norms.append(float(torch.nn.utils.clip_grad_norm_([pa, pb], 1.0, foreach=False)))
        opt.step()
    put("adamw_clip.ga", torch.stack(ga)), put("adamw_clip.gb", torch.stack(gb))
    put("adamw_clip.norm", norms), put("adamw_clip.pa", pa), put("adamw_clip.pb", pb)


def rmsnorm():
    T, H = 6, 12
    x, dy = torch.randn(T, H, requires_grad=True), torch.randn(T, H)
    norm = mix.MixtralRMSNorm(H, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(H) + 0.5)
    y = norm(x)
    y.backward(dy)
    put("rmsnorm.x", x), put("rmsnorm.w", norm.weight), put("rmsnorm.dy", dy)
    put("rmsnorm.y", y), put("rmsnorm.dx", x.grad), put("rmsnorm.dw", norm.weight.grad)


def rotary(nh, hd, S, theta):
    """HF's cos, sin of shape [1, S, hd] for positions 0..S-1."""
    kw = dict(hidden_size=nh * hd, num_attention_heads=nh, num_key_value_heads=nh,
              max_position_embeddings=max(S, 8), head_dim=hd)
    want = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    # transformers 4 takes rope_theta; 5 takes rope_parameters
    for extra in (dict(rope_theta=theta),
                  dict(rope_parameters={"rope_type": "default", "rope_theta": theta})):
        try:
            rope = mix.MixtralRotaryEmbedding(config=transformers.MixtralConfig(**kw, **extra))
        except Exception:
            continue
        if torch.equal(rope.inv_freq.float(), want):
            return rope(torch.zeros(1, S, nh * hd), torch.arange(S)[None, :])
    raise RuntimeError("could not make MixtralRotaryEmbedding take theta %g" % theta)


def rope():
    B, S, nh, hd, theta = 2, 5, 3, 8, 5e5
    cos, sin = rotary(nh, hd, S, theta)
    q = torch.randn(B * S, nh * hd, requires_grad=True)  # our layout [T, nh*hd]
    qh = q.view(B, S, nh, hd).transpose(1, 2)              # HF layout [B, nh, S, hd]
    y, _ = mix.apply_rotary_pos_emb(qh, qh, cos, sin)
    y = y.transpose(1, 2).reshape(B * S, nh * hd)
    dy = torch.randn(B * S, nh * hd)
    y.backward(dy)
    put("rope.x", q), put("rope.y", y), put("rope.dy", dy), put("rope.dx", q.grad)
    # long positions: how far HF's fp32 angles are from exact ones (64 rows stored)
    S, hd, theta = 8192, 8, 5e7
    cos, sin = rotary(1, hd, S, theta)
    pos = torch.cat([torch.tensor([0, 1, 2, 100, 1000, 2047, 4095, 6000, 8191]),
                     torch.randperm(S)[:55]])
    x = torch.zeros(S, hd)
    x[pos] = torch.randn(len(pos), hd)
    y, _ = mix.apply_rotary_pos_emb(x[None, None], x[None, None], cos, sin)
    put("rope_long.pos", pos, "i32"), put("rope_long.x", x[pos]), put("rope_long.y", y[0, 0][pos])


def attention():
    B, S, nh, nkv, hd = 2, 70, 4, 2, 8
    T, g = B * S, nh // nkv
    q = torch.randn(T, nh * hd, requires_grad=True)
    k = torch.randn(T, nkv * hd, requires_grad=True)
    v = torch.randn(T, nkv * hd, requires_grad=True)
    qh = q.view(B, S, nh, hd).transpose(1, 2)
    kh = k.view(B, S, nkv, hd).transpose(1, 2)
    vh = v.view(B, S, nkv, hd).transpose(1, 2)
    mask = torch.full((S, S), torch.finfo(torch.float32).min).triu(1)[None, None]
    # HF eager_attention_forward: repeat_kv, scores * scaling + mask, fp32 softmax, @ v
    if hasattr(mix, "eager_attention_forward"):
        module = type("M", (), {"num_key_value_groups": g, "training": False})()
        out, _ = mix.eager_attention_forward(module, qh, kh, vh, mask, scaling=hd ** -0.5,
                                             dropout=0.0)
        put_text("att.impl", "transformers eager_attention_forward")
    else:  # older transformers: the same steps, written out
        kr, vr = mix.repeat_kv(kh, g), mix.repeat_kv(vh, g)
        a = F.softmax(qh @ kr.transpose(2, 3) * hd ** -0.5 + mask, dim=-1, dtype=torch.float32)
        out = (a @ vr).transpose(1, 2)
        put_text("att.impl", "repeat_kv + softmax written out")
    out = out.reshape(T, nh * hd)  # [B, S, nh, hd] -> our layout
    dout = torch.randn(T, nh * hd)
    out.backward(dout)
    put("att.q", q), put("att.k", k), put("att.v", v), put("att.out", out), put("att.dout", dout)
    put("att.dq", q.grad), put("att.dk", k.grad), put("att.dv", v.grad)


def router():
    T, E, K = 64, 8, 2
    logits = torch.randn(T, E, requires_grad=True)
    probs = F.softmax(logits, dim=1, dtype=torch.float)  # as MixtralSparseMoeBlock
    w, idx = torch.topk(probs, K, dim=-1)
    w = w / w.sum(dim=-1, keepdim=True)
    dw = torch.randn(T, K)
    w.backward(dw)
    put("route.logits", logits), put("route.idx", idx, "i32"), put("route.w", w)
    put("route.dw", dw), put("route.dlogits", logits.grad)
    # HF's aux loss over two layers (it concatenates the layers' logits), coefficient 1
    l0 = torch.randn(T, E, requires_grad=True)
    l1 = torch.randn(T, E, requires_grad=True)
    loss = mix.load_balancing_loss_func((l0, l1), E, K, None)
    loss.backward()
    put("aux.logits", torch.cat([l0, l1])), put("aux.loss", [float(loss)])
    put("aux.dlogits", torch.cat([l0.grad, l1.grad]))


def cross_entropy():
    T, V = 32, 256
    logits = torch.randn(T, V, requires_grad=True)
    labels = torch.randint(0, V, (T,))
    labels[::7] = -100
    loss = F.cross_entropy(logits, labels, ignore_index=-100)
    loss.backward()
    put("ce.logits", logits), put("ce.labels", torch.where(labels < 0, -1, labels), "i32")
    put("ce.loss", [float(loss)]), put("ce.dlogits", logits.grad)


def silu():
    x = (torch.rand(1000) * 16 - 8).requires_grad_()
    y = F.silu(x)
    dy = torch.randn(1000)
    y.backward(dy)
    put("silu.x", x), put("silu.y", y), put("silu.dy", dy), put("silu.dx", x.grad)


def splitmix(n, seed):
    out, s = [], seed
    for _ in range(n):
        s = (s + 0x9E3779B97F4A7C15) & (2**64 - 1)
        z = s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
        out.append((z ^ (z >> 31)) & 0xFFFFFFFF)
    return out


def formats():
    bits = [b for b in splitmix(8192, 7) if not ((b >> 23) & 0xFF == 0xFF and b & 0x7FFFFF)]
    bits += [0x3F808000, 0x3F818000, 0x7F7F8000, 0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x00000001,
             0x00008000, 0x00018000, 0x80000000]
    x = torch.tensor([struct.unpack("<f", struct.pack("<I", b))[0] for b in bits], dtype=torch.float32)
    bf = (x.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF).tolist()
    put("bf16.in", bits, "u32"), put("bf16.out", bf, "u16")
    mags = torch.pow(2.0, torch.rand(4096) * 20.8 - 12) * torch.sign(torch.rand(4096) - 0.5)
    mags = torch.clamp(mags, -448, 448)
    ties = torch.tensor([448.0, -448.0, 2.0**-10, 3 * 2.0**-11, 15 * 2.0**-10, 1.0625, 1.1875,
                         0.0, -0.0, 2.0**-9, 7 * 2.0**-9, 240.0, 232.0])
    x = torch.cat([mags, ties]).float()
    put("e4m3.in", x), put("e4m3.out", x.to(torch.float8_e4m3fn).view(torch.uint8), "u8")


def moe_block():
    T, H, Fd, E, K = 10, 12, 8, 4, 2
    kw = dict(hidden_size=H, intermediate_size=Fd, num_local_experts=E, num_experts_per_tok=K,
              num_attention_heads=2, num_key_value_heads=2)
    blk = mix.MixtralSparseMoeBlock(transformers.MixtralConfig(**kw)).float().eval()
    with torch.no_grad():  # a standalone module is not initialised (torch.empty) in transformers 5
        for p in blk.parameters():
            p.normal_(0.0, 0.3)
    params = dict(blk.named_parameters())
    print("    MoE block parameters:", {n: tuple(p.shape) for n, p in params.items()})
    wg = next(p for n, p in params.items() if "gate" in n and "expert" not in n and p.shape == (E, H))
    if "experts.0.w1.weight" in params:  # transformers 4: one module per expert, [out, in]
        w1 = torch.stack([params["experts.%d.w1.weight" % e].t() for e in range(E)])
        w3 = torch.stack([params["experts.%d.w3.weight" % e].t() for e in range(E)])
        w2 = torch.stack([params["experts.%d.w2.weight" % e].t() for e in range(E)])
    else:  # transformers 5: fused gate_up_proj [E, 2F, H] (gate first), down_proj [E, H, F]
        gu, dn = params["experts.gate_up_proj"], params["experts.down_proj"]
        assert gu.shape == (E, 2 * Fd, H) and dn.shape == (E, H, Fd), "unknown expert layout"
        w1, w3 = gu[:, :Fd, :].transpose(1, 2), gu[:, Fd:, :].transpose(1, 2)
        w2 = dn.transpose(1, 2)
    x = torch.randn(1, T, H, requires_grad=True)
    res = blk(x)
    out = res[0] if isinstance(res, tuple) else res
    dout = torch.randn(1, T, H)
    out.backward(dout)
    put("moe.x", x), put("moe.wg", wg.t()), put("moe.w1", w1), put("moe.w3", w3), put("moe.w2", w2)
    put("moe.out", out), put("moe.dout", dout), put("moe.dx", x.grad)


section("adamw", adamw)
section("rmsnorm", rmsnorm)
section("rope", rope)
section("attention", attention)
section("router", router)
section("cross_entropy", cross_entropy)
section("silu", silu)
section("formats", formats)
section("moe_block", moe_block)

with open(sys.argv[1], "wb") as f:
    f.write(b"MOECKPAR" + struct.pack("<II", 1, len(entries)))
    for name, code, n, data in entries:
        f.write(name.encode().ljust(48, b"\0") + struct.pack("<IIq", code, 0, n) + data)
print("wrote", sys.argv[1], len(entries), "entries")
