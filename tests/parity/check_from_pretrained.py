#!/usr/bin/env python3
"""check_from_pretrained.py -- a moec checkpoint loads with transformers' own loader.

MixtralForCausalLM.from_pretrained(DIR) must load DIR (a moec step-* checkpoint) with no
missing, unexpected or mismatched tensors, and give exactly the weights that
make_reference.py's explicit name mapping puts into the model. With a second directory (the
same weights written sharded, by an expert-parallel run: model-0000k-of-0000N.safetensors and
model.safetensors.index.json), that one must load too, to the same tensors bit for bit.
Usage: python3 tests/parity/check_from_pretrained.py D/step-00000000 [E/step-00000000]
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_reference as ref  # noqa: E402


def main():
    ckpt = sys.argv[1]
    from transformers import MixtralForCausalLM

    hf, info = MixtralForCausalLM.from_pretrained(ckpt, output_loading_info=True, torch_dtype=torch.float32)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f"check_from_pretrained: {ckpt}: transformers reports {problems}")
    mine, cfg = ref.build_model(os.path.join(ckpt, "config.json"), "eager")
    ref.load_weights(mine, cfg, os.path.join(ckpt, "model.safetensors"))
    a, b = hf.state_dict(), mine.state_dict()
    if set(a) != set(b):
        sys.exit(f"check_from_pretrained: parameter sets differ: {sorted(set(a) ^ set(b))[:5]}")
    bad = [k for k in a if not torch.equal(a[k].float(), b[k].float())]
    if bad:
        sys.exit(f"check_from_pretrained: {len(bad)} tensors differ, e.g. {bad[:3]}")
    import transformers
    print(f"check_from_pretrained: {ckpt}: {len(a)} tensors load with from_pretrained "
          f"(transformers {transformers.__version__}), identical to the explicit mapping")
    if len(sys.argv) > 2:
        sharded = sys.argv[2]
        if not os.path.exists(os.path.join(sharded, "model.safetensors.index.json")):
            sys.exit(f"check_from_pretrained: {sharded}: no model.safetensors.index.json (not a sharded checkpoint)")
        hs, info = MixtralForCausalLM.from_pretrained(sharded, output_loading_info=True, torch_dtype=torch.float32)
        problems = {k: v for k, v in info.items() if v}
        if problems:
            sys.exit(f"check_from_pretrained: {sharded}: transformers reports {problems}")
        c = hs.state_dict()
        bad = sorted(set(a) ^ set(c)) or [k for k in a if not torch.equal(a[k].float(), c[k].float())]
        if bad:
            sys.exit(f"check_from_pretrained: {sharded}: {len(bad)} tensors differ from {ckpt}, e.g. {bad[:3]}")
        print(f"check_from_pretrained: {sharded} (sharded) loads to the same {len(c)} tensors")


if __name__ == "__main__":
    main()
