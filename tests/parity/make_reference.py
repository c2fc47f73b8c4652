#!/usr/bin/env python3
"""make_reference.py -- golden training steps of Hugging Face MixtralForCausalLM for moec's
parity test (tests/unit/test_parity.c).

Reads moec's initial weights (model.safetensors, Hugging Face Mixtral names and layouts) and
the config.json beside them, builds MixtralForCausalLM in float32 on the CPU, runs n training
steps (cross-entropy on next-token labels, clip_grad_norm_, AdamW) on fixed random DNA tokens,
and writes the binary reference file described in tests/parity/README.md.

Works with transformers 4.4x (per-expert w1/w2/w3 modules under block_sparse_moe) and 5.x
(experts fused into mlp.experts.gate_up_proj [E, 2F, H] and down_proj [E, H, F]): every
parameter is addressed through its Hugging Face 4.x name (the names moec writes), mapped to a
view of whatever tensor holds it in the installed version.

Usage (see README.md for the full command that made tiny_ref.bin):
  python3 tests/parity/make_reference.py --ckpt D/step-00000000 --out tests/parity/tiny_ref.bin
"""
import argparse
import json
import os
import re
import struct
import sys

import torch
import torch.nn.functional as F

MAGIC = b"MOECREF\0"
VERSION = 1
ACGT = (65, 67, 71, 84)  # ASCII ids of A, C, G, T
N_ID = 78                # ASCII N


def die(msg):
    sys.exit(f"make_reference.py: error: {msg}")


# ---------------------------------------------------------------- parameter naming

_LAYER_MOE = re.compile(r"^(model\.layers\.\d+)\.(?:mlp|block_sparse_moe)\.(.*)$")


def canonical(name):
    """HF 4.x name of a (non-fused) parameter of any transformers version."""
    m = _LAYER_MOE.match(name)
    return f"{m.group(1)}.block_sparse_moe.{m.group(2)}" if m else name


def param_views(model, cfg):
    """[(hf4_name, param, view_fn)], view_fn(t) -> the [out, in] (HF 4.x layout) view of t, where
    t is param.data or param.grad. Fused expert tensors give one entry per expert and matrix."""
    E, Fd, H = cfg.num_local_experts, cfg.intermediate_size, cfg.hidden_size
    out = []
    for name, p in model.named_parameters():
        base = canonical(name)
        if base.endswith(".experts.gate_up_proj") or base.endswith(".experts.down_proj"):
            mod = model.get_submodule(name.rsplit(".", 1)[0])
            transposed = bool(getattr(mod, "is_transposed", False))
            concatenated = bool(getattr(mod, "is_concatenated", True))
            if getattr(mod, "has_bias", False):
                die(f"{name}: experts with biases are not Mixtral")
            prefix = base.rsplit(".", 1)[0]  # model.layers.i.block_sparse_moe.experts
            if base.endswith("gate_up_proj"):
                want = (E, H, 2 * Fd) if transposed else (E, 2 * Fd, H)
                if tuple(p.shape) != want:
                    die(f"{name}: shape {tuple(p.shape)}, expected {want}")
                gate = slice(0, Fd) if concatenated else slice(0, 2 * Fd, 2)
                up = slice(Fd, 2 * Fd) if concatenated else slice(1, 2 * Fd, 2)
                for e in range(E):
                    if transposed:  # [E, H, 2F]
                        g = (lambda e, s: lambda t: t[e][:, s].t())(e, gate)
                        u = (lambda e, s: lambda t: t[e][:, s].t())(e, up)
                    else:           # [E, 2F, H]
                        g = (lambda e, s: lambda t: t[e][s, :])(e, gate)
                        u = (lambda e, s: lambda t: t[e][s, :])(e, up)
                    out.append((f"{prefix}.{e}.w1.weight", p, g))
                    out.append((f"{prefix}.{e}.w3.weight", p, u))
            else:
                want = (E, Fd, H) if transposed else (E, H, Fd)
                if tuple(p.shape) != want:
                    die(f"{name}: shape {tuple(p.shape)}, expected {want}")
                for e in range(E):
                    d = (lambda e: lambda t: t[e].t())(e) if transposed else (lambda e: lambda t: t[e])(e)
                    out.append((f"{prefix}.{e}.w2.weight", p, d))
        else:
            out.append((base, p, lambda t: t))
    # HF 4.x order: per expert w1, w2, w3
    order = {n: i for i, (n, _, _) in enumerate(out)}

    def key(entry):
        m = re.match(r"^(.*\.experts)\.(\d+)\.(w[123])\.weight$", entry[0])
        if not m:
            return (order[entry[0]],)
        first = min(order[n] for n in order if n.startswith(m.group(1) + "."))
        return (first, int(m.group(2)), m.group(3))

    out.sort(key=key)
    names = [n for n, _, _ in out]
    if len(set(names)) != len(names):
        die("two parameters map to one Hugging Face name")
    return out


# ---------------------------------------------------------------- model

def build_model(config_path, attn):
    from transformers import MixtralConfig, MixtralForCausalLM

    with open(config_path) as f:
        d = json.load(f)
    if d.get("model_type") != "mixtral":
        die(f"{config_path}: model_type is {d.get('model_type')!r}, not 'mixtral'")
    d.update(attention_dropout=0.0, router_jitter_noise=0.0, output_router_logits=False,
             use_cache=False)
    for k in ("rms_norm_eps", "rope_theta", "router_aux_loss_coef", "initializer_range"):
        if isinstance(d.get(k), int):  # transformers 5 validates types: 0 is not a float
            d[k] = float(d[k])
    cfg = MixtralConfig.from_dict(d)
    cfg._attn_implementation = attn
    if hasattr(cfg, "_experts_implementation"):  # transformers 5: the per-expert loop
        cfg._experts_implementation = "eager"
    torch.manual_seed(0)  # weights are overwritten; this only makes the construction quiet
    model = MixtralForCausalLM(cfg).to(torch.float32)
    if model.config._attn_implementation != attn:
        die(f"attention implementation is {model.config._attn_implementation}, asked {attn}")
    return model, cfg


def load_weights(model, cfg, st_path):
    from safetensors.torch import load_file

    src = load_file(st_path)
    views = param_views(model, cfg)
    names = {n for n, _, _ in views}
    missing = sorted(names - src.keys())
    unused = sorted(src.keys() - names)
    if missing or unused:
        die(f"{st_path}: tensors missing {missing[:8]}{'...' if len(missing) > 8 else ''}, "
            f"unused {unused[:8]}{'...' if len(unused) > 8 else ''}")
    with torch.no_grad():
        for n, p, view in views:
            t = src[n]
            if t.dtype != torch.float32:
                die(f"{st_path}: {n} is {t.dtype}; parity needs the f32 master weights")
            dst = view(p.data)
            if tuple(t.shape) != tuple(dst.shape):
                die(f"{st_path}: {n} has shape {tuple(t.shape)}, the model {tuple(dst.shape)}")
            dst.copy_(t)
    return views


# ---------------------------------------------------------------- data

def make_tokens(B, S, seed):
    """B rows of S+1 random A/C/G/T bytes with a few N; tokens = [:, :S], labels = [:, 1:]
    with -1 where the target is not A/C/G/T."""
    gen = torch.Generator().manual_seed(seed)
    acgt = torch.tensor(ACGT, dtype=torch.int64)
    stream = acgt[torch.randint(0, 4, (B, S + 1), generator=gen)]
    n_n = max(1, (S + 1) // 16)
    pos = torch.randint(0, S + 1, (B, n_n), generator=gen)
    stream.scatter_(1, pos, N_ID)
    tokens = stream[:, :S].contiguous()
    tgt = stream[:, 1:]
    ok = torch.zeros_like(tgt, dtype=torch.bool)
    for a in ACGT:
        ok |= tgt == a
    labels = torch.where(ok, tgt, torch.full_like(tgt, -1)).contiguous()
    return tokens, labels


# ---------------------------------------------------------------- output

def pack_tensor(name, t):
    t = t.detach().to(torch.float32).contiguous().cpu()
    b = name.encode()
    out = struct.pack("<I", len(b)) + b + struct.pack("<I", t.dim())
    out += struct.pack(f"<{t.dim()}I", *t.shape)
    return out + t.numpy().astype("<f4").tobytes()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", help="directory with model.safetensors and config.json")
    ap.add_argument("--weights", help="model.safetensors (default: CKPT/model.safetensors)")
    ap.add_argument("--config", help="config.json (default: beside the weights)")
    ap.add_argument("--out", required=True, help="reference file to write")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1234, help="torch.Generator seed of the tokens")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--attn", default="eager", choices=["eager", "sdpa"])
    a = ap.parse_args()
    weights = a.weights or (a.ckpt and os.path.join(a.ckpt, "model.safetensors"))
    if not weights:
        die("give --ckpt DIR or --weights FILE")
    config = a.config or os.path.join(os.path.dirname(weights), "config.json")

    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}", file=sys.stderr)
    torch.set_default_dtype(torch.float32)
    model, cfg = build_model(config, a.attn)
    views = load_weights(model, cfg, weights)
    model.train()

    B, S, V = a.batch, cfg.max_position_embeddings, cfg.vocab_size
    tokens, labels = make_tokens(B, S, a.seed)
    if int(tokens.max()) >= V:
        die(f"vocab {V} does not hold the ASCII ids of A/C/G/T/N")

    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": a.wd},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps,
                            foreach=False, fused=False)

    # Routing is discontinuous: a token whose k-th and (k+1)-th router logits are closer than
    # the two implementations' rounding differences could pick another expert in moec. Track
    # the smallest such margin, so the README can say how far the reference is from that.
    margins = []

    def router_hook(_mod, _inp, out):
        logits = (out[0] if isinstance(out, tuple) else out).detach().float()
        top = torch.topk(logits, cfg.num_experts_per_tok + 1, dim=-1).values
        margins.append(float((top[..., -2] - top[..., -1]).min()))

    for name, mod in model.named_modules():
        if re.search(r"\.(mlp|block_sparse_moe)\.gate$", name):
            mod.register_forward_hook(router_hook)
    if cfg.num_experts_per_tok >= cfg.num_local_experts:
        margins.append(float("inf"))

    losses, norms, sample, grads = [], [], None, None
    for step in range(1, a.steps + 1):
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=tokens, use_cache=False).logits.float()  # (B, S, V)
        loss = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-1)
        loss.backward()
        if step == 1:
            sample = logits.detach().reshape(-1, V)[: min(4, B * S)].clone()
            grads = [(n, view(p.grad).clone()) for n, p, view in views]  # before clipping
        norm = torch.nn.utils.clip_grad_norm_(params, a.clip, foreach=False)
        opt.step()
        losses.append(loss.item())
        norms.append(norm.item())
        print(f"step {step}: loss {losses[-1]:.7f} grad_norm {norms[-1]:.7f}", file=sys.stderr)

    print(f"smallest router logit margin between the k-th and (k+1)-th expert: {min(margins):.3e}",
          file=sys.stderr)

    buf = bytearray(MAGIC)
    buf += struct.pack("<5I", VERSION, B, S, V, a.steps)
    buf += tokens.to(torch.int32).numpy().astype("<i4").tobytes()
    buf += labels.to(torch.int32).numpy().astype("<i4").tobytes()
    buf += struct.pack(f"<{a.steps}f", *losses)
    buf += struct.pack(f"<{a.steps}f", *norms)
    buf += sample.numpy().astype("<f4").tobytes()
    buf += struct.pack("<I", len(grads))
    for n, g in grads:
        buf += pack_tensor(n, g)
    buf += struct.pack("<I", len(views))
    for n, p, view in views:
        buf += pack_tensor(n, view(p.data))
    tmp = a.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(buf)
    os.replace(tmp, a.out)
    print(f"wrote {a.out}: {len(buf)} bytes, {len(views)} tensors", file=sys.stderr)


if __name__ == "__main__":
    main()
